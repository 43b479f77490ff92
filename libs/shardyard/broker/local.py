"""Starting the broker a local cluster runs on (``shardyard up``), in its run folder, and saying which and why."""

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Final

from shardyard.broker.choice import Choice
from shardyard.broker.embedded import EMBEDDED_GROWTH, MEMORY, STORAGE_ENV, EmbeddedBroker
from shardyard.broker.kafka import LocalKafka
from shardyard.broker.process import BrokerProcess

KAFKA_FOLDER: Final = "kafka"
"""The local Kafka's folder in the run folder: its configuration and its log (``data/``), which ``down`` leaves
for the next ``up``."""


def start_broker(
    choice: Choice, run_dir: Path, logs: Path, *, fresh: bool, say: Callable[[str], None]
) -> BrokerProcess | None:
    """Start the broker ``choice`` names (none for an outside one), its log in ``logs/broker.log``; ``fresh`` deletes
    the local Kafka's log first."""
    if choice.kind == "external":
        say(f"broker: an outside Kafka at {choice.bootstrap} ({choice.why})")
        return None
    if choice.kind == "kafka":
        folder = run_dir / KAFKA_FOLDER
        if fresh and folder.exists():
            shutil.rmtree(folder)
            say(f"--fresh: the broker's log in {folder} was deleted")
        kafka = LocalKafka(install=choice.install, folder=folder, log_path=logs / "broker.log")
        kept = kafka.formatted
        kafka.start()
        where = f"its log in {kafka.log_dir}" + (" (kept from an earlier run; --fresh starts empty)" if kept else "")
        say(f"broker: Apache Kafka on {kafka.bootstrap}, {where}; {choice.why}")
        return kafka
    embedded = EmbeddedBroker(log_path=logs / "broker.log", storage=os.environ.get(STORAGE_ENV) or MEMORY).start()
    say(f"broker: the embedded broker on {embedded.bootstrap}; {choice.why}")
    say(f"its log is in {embedded.storage}" if embedded.durable else f"warning: {EMBEDDED_GROWTH}")
    return embedded
