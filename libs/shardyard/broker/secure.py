"""A secured local Apache Kafka: TLS, SASL/SCRAM and the ACLs of ``broker.access``.

The broker takes clients only on a TLS listener with SCRAM-SHA-512 (``CLIENTS``). Its KRaft controller listener
takes only TLS with a client certificate of this cluster's CA (the broker's own), so nothing else on the host can
speak to the controller either. Everything lives in ``RUN_DIR/kafka/access`` (mode 700), made by the first ``up``
and kept for the next:

- ``ca.pem`` (the CA every client trusts), ``ca.key``, and ``broker.pem`` (the broker's key and certificate chain,
  for ``127.0.0.1`` and ``localhost``);
- one file per principal (``broker.access.principals``) holding its password, mode 600: a process is given its
  own (``client_env``), never another's.

The principals' SCRAM credentials are written into the log when it is formatted (``format_args``), and put right at
every start (``apply``, over the client listener as the admin), with every ACL of the table, so a team added to the
credentials file gets its principal at the next ``up``.
"""

import datetime
import ipaddress
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from shardyard.broker.access import ADMIN, Grant, grants, principals
from shardyard.bus.transport import CA_FILE_ENV, MECHANISM_ENV, PASSWORD_FILE_ENV, PROTOCOL_ENV, USERNAME_ENV

if TYPE_CHECKING:
    from cryptography import x509

BROKER_CN: Final = "shardyard-broker"
"""The broker's certificate's name: its principal on the controller listener (``User:CN=shardyard-broker``)."""
MECHANISM: Final = "SCRAM-SHA-512"
SCRAM_ITERATIONS: Final = 8192


@dataclass(frozen=True)
class Access:
    """A cluster's transport security material (see the module's doc)."""

    folder: Path

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.folder / "broker.pem"

    def password_file(self, principal: str) -> Path:
        return self.folder / principal

    def password(self, principal: str) -> str:
        return self.password_file(principal).read_text().strip()

    def has(self, principal: str) -> bool:
        return self.password_file(principal).exists()


LOCAL_HOSTS: Final = ("localhost", "127.0.0.1")


def make_access(folder: Path, teams: Iterable[str], hosts: Sequence[str] = LOCAL_HOSTS) -> Access:
    """The run folder's material, made where missing: the CA and the broker's certificate (for ``hosts``, names or
    addresses) once, a password for each principal that has none."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    access = Access(folder)
    if not (access.ca_file.exists() and access.keystore.exists()):
        _write_certificates(access, hosts)
    for principal in principals(teams):
        if not access.has(principal):
            _write_private(access.password_file(principal), secrets.token_hex(24))
    return access


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text + "\n")


def _write_certificates(access: Access, hosts: Sequence[str]) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shardyard-local-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [_subject_name(host) for host in hosts]
    usage = [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, BROKER_CN)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    pkcs8 = serialization.PrivateFormat.PKCS8
    plain = serialization.NoEncryption()
    _write_private(access.folder / "ca.key", ca_key.private_bytes(pem, pkcs8, plain).decode().strip())
    # Kafka reads a PEM keystore as the private key (PKCS#8, unencrypted) followed by the certificate chain.
    chain = key.private_bytes(pem, pkcs8, plain) + certificate.public_bytes(pem) + ca.public_bytes(pem)
    _write_private(access.keystore, chain.decode().strip())
    access.ca_file.write_text(ca.public_bytes(pem).decode())


def _subject_name(host: str) -> "x509.GeneralName":
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def listener_properties(
    access: Access, *, clients: Mapping[str, tuple[str, str]], controller: str, keystore: str | None = None
) -> dict[str, str]:
    """The broker's listeners and their security: each of ``clients`` (name -> where it binds, what it advertises;
    the first carries the broker's own traffic) on TLS with SCRAM, the KRaft controller (bound at ``controller``) on
    TLS with the broker's certificate, the ACLs' authorizer, and the admin and the broker itself as super users.
    ``keystore``: where the broker reads ``broker.pem`` (default: in ``access``)."""
    inter_broker = next(iter(clients))
    login = "org.apache.kafka.common.security.scram.ScramLoginModule required"
    jaas = {
        f"listener.name.{name.lower()}.{MECHANISM.lower()}.sasl.jaas.config": (
            f'{login} username="{ADMIN}" password="{access.password(ADMIN)}";' if name == inter_broker else f"{login};"
        )
        for name in clients
    }
    folder = Path(keystore).parent if keystore else access.folder
    return {
        "listeners": ",".join(
            [*(f"{name}://{bind}" for name, (bind, _) in clients.items()), f"CONTROLLER://{controller}"]
        ),
        "advertised.listeners": ",".join(f"{name}://{advertised}" for name, (_, advertised) in clients.items()),
        "listener.security.protocol.map": ",".join([*(f"{name}:SASL_SSL" for name in clients), "CONTROLLER:SSL"]),
        "inter.broker.listener.name": inter_broker,
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        **jaas,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(folder / access.keystore.name),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(folder / access.ca_file.name),
        "listener.name.controller.ssl.client.auth": "required",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{ADMIN};User:CN={BROKER_CN}",
    }


def principals_of(access: Access) -> list[str]:
    """The principals ``access`` holds a password of."""
    return sorted(path.name for path in access.folder.iterdir() if path.suffix not in (".pem", ".key"))


def format_args(access: Access, names: Iterable[str]) -> list[str]:
    """The storage tool's arguments that write these principals' SCRAM credentials into a new log."""
    args: list[str] = []
    for name in names:
        args += ["--add-scram", f"{MECHANISM}=[name={name},password={access.password(name)}]"]
    return args


def client_env(access: Access, principal: str) -> dict[str, str]:
    """The environment that makes a process's clients (``bus.transport``) speak to the broker as ``principal``."""
    return {
        PROTOCOL_ENV: "SASL_SSL",
        MECHANISM_ENV: MECHANISM,
        CA_FILE_ENV: str(access.ca_file),
        USERNAME_ENV: principal,
        PASSWORD_FILE_ENV: str(access.password_file(principal)),
    }


def apply(bootstrap: str, access: Access, teams: Iterable[str]) -> None:
    """Every principal's SCRAM credential and every ACL of ``broker.access``, set as the admin (both idempotent)."""
    from kafka.admin import (
        ACL,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourceType,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    teams = list(teams)
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap,
        client_id="shardyard-access",
        security_protocol="SASL_SSL",
        ssl_cafile=str(access.ca_file),
        sasl_mechanism=MECHANISM,
        sasl_plain_username=ADMIN,
        sasl_plain_password=access.password(ADMIN),
    )
    try:
        upserts = [
            UserScramCredentialUpsertion(name, ScramMechanism.SCRAM_SHA_512, access.password(name), SCRAM_ITERATIONS)
            for name in principals(teams)
        ]
        failed = {name: error for name, error in admin.alter_user_scram_credentials(upserts).items() if error}
        if failed:
            raise RuntimeError(f"SCRAM credentials refused: {failed}")

        def acl(grant: Grant, operation: str) -> ACL:
            kind = ResourceType.TOPIC if grant.resource == "topic" else ResourceType.GROUP
            pattern = ACLResourcePatternType.PREFIXED if grant.prefixed else ACLResourcePatternType.LITERAL
            return ACL(
                f"User:{grant.principal}",
                "*",
                ACLOperation[operation],
                ACLPermissionType.ALLOW,
                ResourcePattern(kind, grant.name, pattern),
            )

        result = admin.create_acls([acl(grant, op) for grant in grants(teams) for op in grant.operations])
        if result.get("failed"):
            raise RuntimeError(f"ACLs refused: {result['failed'][:3]}")
    finally:
        admin.close()
