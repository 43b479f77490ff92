"""Two replicas of a service that split their work by key, and what they are doing: the events each published (its
``/metrics``) and the partitions it last said it owns (its log)."""

import re
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from shardyard.bus.topics import Topic, partition_of
from shardyard.events import ServiceReady
from tests.support.events import Watcher
from tests.support.processes import service
from tests.support.runners import free_port


def one_key_per_partition(prefix: str, topic: Topic) -> dict[int, str]:
    """A key ``<prefix>-<n>`` for every partition of ``topic``."""
    keys: dict[int, str] = {}
    for n in range(200):
        keys.setdefault(partition_of(f"{prefix}-{n}", topic), f"{prefix}-{n}")
    assert len(keys) == topic.partitions
    return keys


def published(port: int, topic: Topic) -> float:
    """How many events to ``topic`` the process serving ``/metrics`` on ``port`` published (0 before it serves)."""
    return _counted(port, "shardyard_events_published_total", topic)


def consumed(port: int, topic: Topic) -> float:
    """How many messages of ``topic`` the process serving ``/metrics`` on ``port`` consumed (0 before it serves)."""
    return _counted(port, "shardyard_events_consumed_total", topic)


def _counted(port: int, counter: str, topic: Topic) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    pattern = counter + r'\{topic="' + re.escape(topic.name) + r'"\} ([0-9.e+]+)'
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


def owned(log: Path, topic: Topic) -> list[int] | None:
    """The partitions of ``topic`` a replica last said it owns (:class:`shardyard.bus.ownership.Ownership`), or None
    before it said so."""
    pattern = " of " + re.escape(topic.name) + r" partitions \[([0-9, ]*)\]"
    found = re.findall(pattern, log.read_text(errors="replace"))
    return [int(p) for p in found[-1].split(",") if p.strip()] if found else None


@dataclass
class TwoReplicas:
    """Two replicas of a service that split ``topic``'s partitions, each serving ``/metrics`` on its port."""

    topic: Topic
    ports: list[int]
    first: subprocess.Popen[bytes]
    second_log: Path

    def both_published(self, topic: Topic) -> bool:
        return all(published(port, topic) > 0 for port in self.ports)

    async def kill_the_first(self, watch: Watcher) -> None:
        """SIGKILL the first replica and wait until the second owns every partition."""
        self.first.kill()
        everything = list(range(self.topic.partitions))
        await watch.until(lambda: owned(self.second_log, self.topic) == everything, timeout_s=60, what="a takeover")


@asynccontextmanager
async def two_replicas(
    module: str, name: str, topic: Topic, *, bootstrap: str, log_dir: Path, watch: Watcher
) -> AsyncIterator[TwoReplicas]:
    """Runs replicas ``<name>-0`` and ``<name>-1`` of ``module`` (``watch`` reads the services topic) and yields once
    each owns half of ``topic``'s partitions."""
    ports = [free_port(), free_port()]
    logs = log_dir / name
    replicas = [["--instance", f"{name}-{i}", "--metrics-port", str(ports[i])] for i in (0, 1)]
    half = topic.partitions // 2
    with (
        service(module, replicas[0], bootstrap=bootstrap, log_dir=logs) as first,
        service(module, replicas[1], bootstrap=bootstrap, log_dir=logs),
    ):
        await watch.until(
            lambda: all(watch.of(ServiceReady, instance=f"{name}-{i}") for i in (0, 1)), timeout_s=60, what="both ready"
        )
        await watch.until(
            lambda: [len(owned(p, topic) or []) for p in logs.iterdir()] == [half, half],
            timeout_s=60,
            what="half the partitions each",
        )
        second = next(p for p in logs.iterdir() if f"{name}-1" in p.read_text(errors="replace"))
        yield TwoReplicas(topic, ports, first, second)
