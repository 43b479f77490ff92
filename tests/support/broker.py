"""Which broker the tests talk to: ``SHARDYARD_KAFKA_BOOTSTRAP`` if set, else testcontainers Kafka if a Docker
engine answers, else the embedded broker. Never a mocked bus."""

import contextlib
import os
from collections.abc import Iterator


def docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=2)
        client.ping()
        return True
    except Exception:
        return False


@contextlib.contextmanager
def real_broker() -> Iterator[str]:
    external = os.environ.get("SHARDYARD_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    if docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka:
            yield kafka.get_bootstrap_server()
        return
    from shardyard.embedded import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker.bootstrap
