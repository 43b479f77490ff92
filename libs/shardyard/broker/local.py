"""Starting the broker a local cluster runs on (``shardyard up``), in its run folder, and saying which and why."""

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from shardyard.broker.choice import Choice
from shardyard.broker.embedded import EMBEDDED_GROWTH, MEMORY, STORAGE_ENV, EmbeddedBroker
from shardyard.broker.kafka import LocalKafka
from shardyard.broker.process import BrokerProcess

if TYPE_CHECKING:  # the CLI loads this module; the access table loads the event models
    from shardyard.broker.secure import Access

ACCESS_FOLDER: Final = "access"
"""In the local Kafka's folder: its CA and its principals' passwords (``broker.secure``)."""
KAFKA_FOLDER: Final = "kafka"
"""The local Kafka's folder in the run folder: its configuration and its log (``data/``), which ``down`` leaves
for the next ``up``."""


def start_broker(
    choice: Choice,
    run_dir: Path,
    logs: Path,
    *,
    fresh: bool,
    say: Callable[[str], None],
    teams: Sequence[str] | None = None,
) -> tuple[BrokerProcess | None, "Access | None"]:
    """Start the broker ``choice`` names (none for an outside one), its log in ``logs/broker.log``; ``fresh`` deletes
    the local Kafka's log first. ``teams``: a secured cluster's teams, each a principal of the local Kafka, which
    then takes only TLS with SCRAM and enforces ``broker.access``'s ACLs (returned: what its clients need)."""
    if choice.kind == "external":
        say(f"broker: an outside Kafka at {choice.bootstrap} ({choice.why})")
        return None, None
    say(f"starting the broker ({choice.kind}): its log goes to {logs / 'broker.log'}")
    if choice.kind == "kafka":
        folder = run_dir / KAFKA_FOLDER
        if fresh and folder.exists():
            shutil.rmtree(folder)
            say(f"--fresh: the broker's log in {folder} was deleted")
        access = None if teams is None else _access(folder / ACCESS_FOLDER, teams)
        kafka = LocalKafka(install=choice.install, folder=folder, log_path=logs / "broker.log", access=access)
        kept = kafka.formatted
        kafka.start()
        where = f"its log in {kafka.log_dir}" + (" (kept from an earlier run; --fresh starts empty)" if kept else "")
        say(f"broker: Apache Kafka on {kafka.bootstrap}, {where}; {choice.why}")
        if access is not None:
            from shardyard.broker.secure import apply

            apply(kafka.bootstrap, access, teams or ())
            say(f"broker secured: TLS and SCRAM only, ACLs per principal (passwords and CA in {access.folder})")
        else:
            say("broker NOT secured: any process of this host can read and write every topic (an open cluster)")
        return kafka, access
    embedded = EmbeddedBroker(log_path=logs / "broker.log", storage=os.environ.get(STORAGE_ENV) or MEMORY).start()
    say(f"broker: the embedded broker on {embedded.bootstrap}; {choice.why}")
    say(f"its log is in {embedded.storage}" if embedded.durable else f"warning: {EMBEDDED_GROWTH}")
    if teams is not None:
        say("warning: the embedded broker has no TLS, SASL or ACLs: any process of this host can read every topic")
    return embedded, None


def _access(folder: Path, teams: Sequence[str]) -> "Access":
    from shardyard.broker.secure import make_access

    return make_access(folder, teams)
