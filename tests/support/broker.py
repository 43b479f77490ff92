"""Which broker the tests talk to: ``SHARDYARD_KAFKA_BOOTSTRAP`` if set (an outside Kafka), else a broker of their
own: the local Apache Kafka (``./dev`` installs it), or what ``SHARDYARD_TEST_BROKER`` names: ``kafka``,
``embedded`` (the fallback broker) or ``container`` (testcontainers' Kafka, where a Docker engine answers). Never a
mocked bus. Without its broker a test fails and says why; it never falls back to another."""

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from shardyard.broker.embedded import EmbeddedBroker
from shardyard.broker.install import find_install
from shardyard.broker.kafka import LocalKafka
from shardyard.broker.process import BrokerProcess
from shardyard.errors import BrokerStartError

TEST_BROKER_ENV: Final = "SHARDYARD_TEST_BROKER"
KINDS: Final = ("kafka", "embedded", "container")


def test_broker_kind() -> str:
    kind = os.environ.get(TEST_BROKER_ENV, "kafka").strip().lower() or "kafka"
    if kind not in KINDS:
        raise BrokerStartError(f"{TEST_BROKER_ENV}={kind!r}: one of {', '.join(KINDS)}")
    return kind


def integration_broker_kinds() -> tuple[str, ...]:
    """The brokers each broker-dependent integration module runs on: the local Apache Kafka, then once more the
    embedded fallback, so that it stays honest; only the one configured where one is (an outside Kafka, or
    ``SHARDYARD_TEST_BROKER``)."""
    if os.environ.get("SHARDYARD_KAFKA_BOOTSTRAP"):
        return ("external",)
    if os.environ.get(TEST_BROKER_ENV):
        return (test_broker_kind(),)
    return ("kafka", "embedded")


def own_broker(kind: str, folder: Path) -> BrokerProcess:
    """A broker of ``kind`` (``kafka`` or ``embedded``) for a test that starts, stops or pauses it itself: not
    started; its log (and a Kafka's data) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "embedded":
        return EmbeddedBroker(log_path=folder / "broker.log")
    install, why = find_install()
    if install is None:
        raise BrokerStartError(f"the tests run on Apache Kafka: {why} (or set {TEST_BROKER_ENV}=embedded)")
    return LocalKafka(install=install, folder=folder / "kafka", log_path=folder / "broker.log")


@contextlib.contextmanager
def real_broker(kind: str | None = None) -> Iterator[str]:
    """A broker's bootstrap address for the time of the block: an outside one if configured, else a new broker of
    ``kind`` (default: :func:`test_broker_kind`), stopped afterwards."""
    external = os.environ.get("SHARDYARD_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    kind = kind or test_broker_kind()
    if kind == "external":
        raise BrokerStartError("an outside broker is named by SHARDYARD_KAFKA_BOOTSTRAP, which is not set")
    if kind == "container":
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka:
            yield kafka.get_bootstrap_server()
        return
    if kind == "embedded":
        with EmbeddedBroker() as broker:
            yield broker.bootstrap
        return
    with local_kafka() as kafka:
        yield kafka.bootstrap


@contextlib.contextmanager
def local_kafka(folder: Path | None = None) -> Iterator[LocalKafka]:
    """A local Apache Kafka of its own (its log in ``folder``, else a temporary one deleted afterwards)."""
    install, why = find_install()
    if install is None:
        raise BrokerStartError(f"the tests run on Apache Kafka: {why} (or set {TEST_BROKER_ENV}=embedded)")
    with contextlib.ExitStack() as stack:
        if folder is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="shardyard-kafka-")))
        kafka = LocalKafka(install=install, folder=folder / "kafka", log_path=folder / "broker.log")
        with kafka:
            yield kafka
