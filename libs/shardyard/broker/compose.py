"""The compose cluster's broker (``docker-compose.yml``), from the same sources as the local one ``shardyard up``
starts and the tests run: the settings of ``broker.properties``, the listeners' security of ``broker.secure`` and
the ACLs of ``broker.access``. Compose cannot run here; what it runs is what the tests run, with its own addresses.

Two one-shot containers of the Shardyard image prepare it, in the shared secrets volume:

- ``python -m shardyard.broker.compose files /secrets [TEAM ...]`` (before the broker): the CA, the broker's
  certificate (for ``kafka``, ``localhost`` and ``127.0.0.1``), a password per principal, the cluster secret that
  seals events, the broker's ``server.properties``, its start script (which formats the log once, with the admin's
  SCRAM credential, then starts the broker), and the admin's client settings (the broker's health check);
- ``python -m shardyard.broker.compose setup kafka:9092 /secrets [TEAM ...]`` (once the broker is healthy): every
  principal's SCRAM credential and every ACL, and the catalogue's topics, as the admin over TLS.

The broker listens for the cluster's processes on ``kafka:9092`` and for teams and operators on the host's
``localhost:9094`` (both TLS with SCRAM); its KRaft controller on ``kafka:9093`` takes only the broker's certificate.
"""

import asyncio
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from shardyard.broker.access import ADMIN, principals
from shardyard.broker.properties import render, shared_properties
from shardyard.broker.secure import MECHANISM, Access, apply, client_env, format_args, listener_properties, make_access

HOST: Final = "kafka"
CLIENT_PORT: Final = 9092
CONTROLLER_PORT: Final = 9093
EXTERNAL_PORT: Final = 9094
SECRETS: Final = "/secrets"
LOG_DIR: Final = "/var/lib/kafka/data"
KAFKA_BIN: Final = "/opt/kafka/bin"
BROKER_UID: Final = 1000
"""The ``apache/kafka`` image's ``appuser``: it reads the broker's files."""
HOSTS: Final = (HOST, "localhost", "127.0.0.1")
CLUSTER_ID: Final = "c2hhcmR5YXJkLWNvbXBvc2U"
"""The compose cluster's KRaft id (22 characters of base64, as Kafka's storage tool wants; one cluster per volume)."""


def broker_properties(access: Access) -> dict[str, str]:
    """The compose broker's ``server.properties``: the shared settings, its log, its listeners and their security."""
    return {
        **shared_properties(),
        "controller.listener.names": "CONTROLLER",
        "controller.quorum.voters": f"1@{HOST}:{CONTROLLER_PORT}",
        "log.dirs": LOG_DIR,
        **listener_properties(
            access,
            clients={
                "CLIENTS": (f"0.0.0.0:{CLIENT_PORT}", f"{HOST}:{CLIENT_PORT}"),
                "EXTERNAL": (f"0.0.0.0:{EXTERNAL_PORT}", f"localhost:{EXTERNAL_PORT}"),
            },
            controller=f"0.0.0.0:{CONTROLLER_PORT}",
            keystore=f"{SECRETS}/{access.keystore.name}",
        ),
    }


def start_script(access: Access) -> str:
    """The broker container's command: format the log once (with the admin's SCRAM credential: it applies the
    others), then run the broker."""
    properties = f"{SECRETS}/server.properties"
    scram = " ".join(shlex.quote(arg) for arg in format_args(access, [ADMIN]))
    return (
        "#!/bin/bash\n# written by python -m shardyard.broker.compose files\nset -euo pipefail\n"
        f"{KAFKA_BIN}/kafka-storage.sh format --ignore-formatted --cluster-id {CLUSTER_ID} --config {properties} "
        f"{scram}\n"
        f"exec {KAFKA_BIN}/kafka-server-start.sh {properties}\n"
    )


def admin_client_properties(access: Access) -> str:
    """Kafka's own tools' client settings as the admin (``--command-config``), for the broker's health check."""
    return (
        "security.protocol=SASL_SSL\n"
        f"sasl.mechanism={MECHANISM}\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{ADMIN}" password="{access.password(ADMIN)}";\n'
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={SECRETS}/{access.ca_file.name}\n"
    )


def write_files(folder: Path, teams: Sequence[str]) -> Access:
    """Everything the compose broker and its clients read from the secrets volume ``folder`` (see the module's
    doc); what exists is kept (a CA, passwords, the cluster secret), the broker's configuration is rewritten."""
    from shardyard.cluster_secret import write_secret

    access = make_access(folder, teams, HOSTS)
    folder.chmod(0o755)  # every container mounts it; each secret in it is mode 600
    if not (folder / "cluster.secret").exists():
        write_secret(folder / "cluster.secret")
    broker_files = {
        folder / "server.properties": render(broker_properties(access)),
        folder / "start-kafka.sh": start_script(access),
        folder / "admin.properties": admin_client_properties(access),
    }
    for path, text in broker_files.items():
        path.write_text(text)
    for path in [*broker_files, access.keystore]:
        path.chmod(0o600)
        if os.geteuid() == 0:
            os.chown(path, BROKER_UID, BROKER_UID)
    return access


def setup(bootstrap: str, folder: Path, teams: Sequence[str]) -> None:
    """Credentials, ACLs and topics on the running broker, as the admin."""
    from shardyard.bus.admin import ensure_topics

    access = make_access(folder, teams, HOSTS)
    apply(bootstrap, access, teams)
    asyncio.run(ensure_topics(bootstrap, environ=client_env(access, ADMIN), timeout_s=120))


def main(argv: list[str]) -> int:
    usage = (
        "usage: python -m shardyard.broker.compose files FOLDER [TEAM ...]\n"
        "       python -m shardyard.broker.compose setup BOOTSTRAP FOLDER [TEAM ...]"
    )
    if argv[:1] == ["files"] and len(argv) >= 2:
        folder, teams = Path(argv[1]), argv[2:]
        write_files(folder, teams)
        print(f"broker files for {len(principals(teams))} principals in {folder}", file=sys.stderr)
        return 0
    if argv[:1] == ["setup"] and len(argv) >= 3:
        bootstrap, folder, teams = argv[1], Path(argv[2]), argv[3:]
        setup(bootstrap, folder, teams)
        print(f"credentials, ACLs and topics of {len(principals(teams))} principals on {bootstrap}", file=sys.stderr)
        return 0
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
