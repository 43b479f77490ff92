"""What ``bench/scale.py`` reads off the bus and the processes: job lifecycle and node-state events (receipt times),
consumer-group lag, Prometheus samples and CPU time.

It reads the broker ``SHARDYARD_BROKER`` names (``bench/scale.py`` sets it for the cluster it starts), and handles
two Tansu-only differences here: Tansu (the embedded broker) answers ListOffsets "latest" with the last record
*batch*'s base offset + 1, so an end offset is short by all but one record of that batch (``true_ends`` corrects it
there by reading the last batch of each partition; the services' own ``shardyard_consumer_lag_messages`` has no such
correction and can read low there, even negative); and an OffsetFetch for all of a group's partitions (none named)
fails on Tansu, so partitions are named.
"""

import asyncio
import contextlib
import json
import os
import re
import time
import urllib.request
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from shardyard.bus.quirks import fetch_wait_ms, on_tansu
from shardyard.bus.topics import CATALOGUE, FAILURES, LIFECYCLE, NODE_STATE

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
JOB_EVENTS = ("accepted", "rejected", "ready", "scheduled", "running", "succeeded", "failed", "unschedulable")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float | None:
    """Resident memory of a process; None once it is gone."""
    try:
        return round(int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20, 1)
    except OSError:
        return None


def percentile(values: Sequence[float], q: float) -> float | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else None


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


class BusWatch:
    """Reads the lifecycle, node-state and failures topics from their end (no group), noting when each record
    arrived here (``time.time()``). Node states are counted; only those not ALIVE are decoded."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.jobs: dict[str, dict[str, float]] = defaultdict(dict)
        """job -> event (accepted, ready, scheduled...) -> receipt time of its first"""
        self.occurred: dict[str, dict[str, float]] = defaultdict(dict)
        """the same, as the events' own ``occurred_at``"""
        self.node_states = 0
        self.seen_nodes: set[str] = set()
        self.not_alive: list[tuple[str, str, float, float]] = []
        """(node, status, occurred_at, received) of each node state other than ALIVE"""
        self.lost: list[tuple[str, float, float]] = []
        """(node, occurred_at, received) of each NodeLost"""
        self._task: asyncio.Task[None] | None = None
        # what the job's path waits on this broker (bus.quirks): Tansu holds a fetch for up to its max wait even
        # once records are there, which would add some 140 ms to every arrival time here at 500 ms
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            max_partition_fetch_bytes=8 << 20,
            fetch_max_wait_ms=fetch_wait_ms(job_path=True),
        )

    async def start(self) -> None:
        consumer = self._consumer
        await consumer.start()
        await consumer.topics()
        tps = [TopicPartition(t.name, p) for t in (LIFECYCLE, NODE_STATE, FAILURES) for p in range(t.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)  # resolved before anything is submitted
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()

    async def _run(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=200, max_records=20_000)
            now = time.time()
            for tp, records in batches.items():
                if tp.topic == NODE_STATE.name:
                    self.node_states += len(records)
                    for record in records:
                        self.seen_nodes.add((record.key or b"").decode())
                        if b'"status":"ALIVE"' not in record.value[:400]:
                            state = json.loads(record.value)
                            self.not_alive.append((state["node_id"], state["status"], _ts(state["occurred_at"]), now))
                elif tp.topic == FAILURES.name:
                    for record in records:
                        lost = json.loads(record.value)
                        self.lost.append((lost["node_id"], _ts(lost["occurred_at"]), now))
                else:
                    for record in records:
                        event = json.loads(record.value)
                        kind = str(event.get("type", "")).removeprefix("job.")
                        job = event.get("job_id")
                        if kind in JOB_EVENTS and job and kind not in self.jobs[job]:
                            self.jobs[job][kind] = now
                            self.occurred[job][kind] = _ts(event["occurred_at"])


async def true_ends(consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    """End offsets: the offset after the last record of each partition (corrected on Tansu, see the module)."""
    ends: dict[TopicPartition, int] = await consumer.end_offsets(tps)
    if not on_tansu():
        return ends
    probe = [tp for tp in tps if ends[tp] > 0]
    consumer.assign(probe)
    for tp in probe:
        consumer.seek(tp, ends[tp] - 1)
    seen: dict[TopicPartition, int] = {}
    deadline = time.monotonic() + 3.0
    while len(seen) < len(probe) and time.monotonic() < deadline:
        got = await consumer.getmany(*[tp for tp in probe if tp not in seen], timeout_ms=200, max_records=100_000)
        seen.update({tp: records[-1].offset + 1 for tp, records in got.items() if records})
    return {tp: max(ends[tp], seen.get(tp, 0)) for tp in tps}


class GroupLag:
    """Committed offsets of every consumer group against the (corrected) end offsets, per group and topic."""

    def __init__(self, bootstrap: str) -> None:
        self.admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, fetch_max_wait_ms=fetch_wait_ms(job_path=True)
        )
        self.tps = [TopicPartition(t.name, p) for t in CATALOGUE for p in range(t.partitions)]
        self.error: str | None = None

    async def start(self) -> None:
        await self.admin.start()
        await self.consumer.start()

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.admin.close()

    async def sample(self) -> dict[str, dict[str, int]] | None:
        """group -> topic -> messages behind; None when the broker refused (``error`` says why)."""
        try:
            groups = sorted(g[0] for g in await self.admin.list_consumer_groups())
            ends = await true_ends(self.consumer, self.tps)
            out: dict[str, dict[str, int]] = {}
            for group in groups:
                committed = await self.admin.list_consumer_group_offsets(group, partitions=self.tps)
                for tp, meta in committed.items():
                    if meta.offset >= 0:
                        topics = out.setdefault(group, {})
                        topics[tp.topic] = topics.get(tp.topic, 0) + max(0, ends[tp] - meta.offset)
            return out
        except Exception as exc:  # an admin call Tansu does not answer: fall back to the services' metric
            self.error = f"{type(exc).__name__}: {exc}"
            return None


def scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return None


def samples(text: str | None, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of metric ``name`` (e.g. ``shardyard_events_consumed_total``): (labels, value)."""
    found = []
    for line in (text or "").splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, _, value = line.rpartition(" ")
            found.append((dict(_LABEL.findall(labels)), float(value)))
    return found


def metric_lag(texts: dict[str, str | None]) -> dict[str, dict[str, float]]:
    """Each process's own ``shardyard_consumer_lag_messages``: process -> "group/topic" -> messages."""
    out: dict[str, dict[str, float]] = {}
    for name, text in texts.items():
        for labels, value in samples(text, "shardyard_consumer_lag_messages"):
            out.setdefault(name, {})[f"{labels.get('group')}/{labels.get('topic')}"] = value
    return out
