"""Genuine events played back against a real secured cluster (``shardyard up``, sealed events; ``shardyard.bus.seal``):
an attacker who can read and write the bus records a node's lease and an operator's undrain, byte for byte with
their seals, and appends them again later, as a plain Kafka client could.

- A node whose agent is frozen (SIGSTOP: a hung host) is not kept ALIVE by its last lease played back once a second:
  it goes SUSPECT and then LOST on time, and the replays are dead-lettered ``REPLAYED``.
- After drain, undrain, drain, the captured undrain played back leaves the node drained, and is dead-lettered
  ``REPLAYED``; also when the resource pool was restarted in between (its group resumes past the undrain it believed:
  it reads the last minute back first).
"""

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardyard.bus.assigned import assigned_consumer
from shardyard.bus.codec import decode
from shardyard.bus.seal import FORGED_HEADER
from shardyard.bus.topics import DEADLETTER, HEARTBEATS
from shardyard.bus.transport import client_options
from shardyard.cli.client import node
from shardyard.cli.cluster import ClusterInfo
from shardyard.cli.cluster_info import ADMIN_PRINCIPAL, get_json
from shardyard.events import Event, NodeDrain, NodeLease
from tests.support import wait
from tests.support.cluster import ONE_REPLICA, cli, speaking_as
from tests.support.events import Producer

pytestmark = [pytest.mark.slow, pytest.mark.broker]


@dataclass(frozen=True)
class Captured:
    """A record as an eavesdropper keeps it: bytes, key and headers (its seal among them)."""

    value: bytes
    key: bytes | None
    headers: list[tuple[str, bytes]]
    event: Event


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ClusterInfo]]:
    run_dir = tmp_path_factory.mktemp("replayed")
    nodes = ("--node", "A100:1") * 3
    started = cli("up", *ONE_REPLICA, *nodes, run_dir=run_dir, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        info = ClusterInfo.load(run_dir)
        assert info.secret_file, "up seals events by default"
        with speaking_as(info, ADMIN_PRINCIPAL):  # the attacker writes where an operator may
            yield run_dir, info
    finally:
        cli("down", run_dir=run_dir, timeout=120)


def newest_record(bootstrap: str, wanted: Callable[[Event], bool]) -> Captured | None:
    """The newest record of the heartbeats topic whose event ``wanted`` keeps, read as any reader of the broker."""

    async def read() -> Captured | None:
        consumer, partitions = await assigned_consumer(bootstrap, [HEARTBEATS], fetch_max_wait_ms=200)
        found: Captured | None = None
        try:
            ends = await consumer.end_offsets(partitions)
            pending = {tp for tp, end in ends.items() if end > 0}
            while pending:
                for tp, records in (await consumer.getmany(*pending, timeout_ms=500)).items():
                    for record in records:
                        if record.offset >= ends[tp]:
                            pending.discard(tp)
                            break
                        event = decode(HEARTBEATS, record.value or b"")
                        if wanted(event):
                            found = Captured(record.value or b"", record.key, list(record.headers), event)
                for tp in list(pending):
                    if await consumer.position(tp) >= ends[tp]:
                        pending.discard(tp)
        finally:
            await consumer.stop()
        return found

    return asyncio.run(read())


async def play_back(bootstrap: str, captured: Captured, times: int, every_s: float) -> list[str]:
    """Append ``captured`` again ``times`` times; where each copy landed (``topic/partition/offset``)."""
    landed = []
    async with Producer(bootstrap) as send:
        for _ in range(times):
            meta = await send.raw(HEARTBEATS.name, captured.value, key=captured.key, headers=captured.headers)
            landed.append(f"{meta.topic}/{meta.partition}/{meta.offset}")
            await asyncio.sleep(every_s)
    return landed


def replays_refused(bootstrap: str) -> dict[str, set[str]]:
    """Source record (``topic/partition/offset``) -> the services that dead-lettered it ``REPLAYED``."""
    from aiokafka import AIOKafkaConsumer

    async def read() -> dict[str, set[str]]:
        consumer = AIOKafkaConsumer(
            DEADLETTER.name, bootstrap_servers=bootstrap, auto_offset_reset="earliest", **client_options()
        )
        await consumer.start()
        try:
            batches = await consumer.getmany(timeout_ms=2000, max_records=100_000)
        finally:
            await consumer.stop()
        found: dict[str, set[str]] = {}
        for records in batches.values():
            for record in records:
                headers = {name: value.decode() for name, value in record.headers or ()}
                if headers.get(FORGED_HEADER) == "REPLAYED":
                    found.setdefault(headers["x-shardyard-source"], set()).add(headers["x-shardyard-service"])
        return found

    return asyncio.run(read())


def status(info: ClusterInfo, node_id: str) -> dict[str, Any]:
    shown = node(info.live().monitor_url, node_id)
    assert shown is not None
    return shown


@pytest.mark.timeout(300)
def test_a_frozen_nodes_last_lease_played_back_does_not_keep_it_alive(cluster: tuple[Path, ClusterInfo]) -> None:
    (_, info), victim = cluster, "node-2"
    wait.until(lambda: status(info, victim)["status"] == "ALIVE", f"{victim} ALIVE", 60)
    captured = wait.until(
        lambda: newest_record(info.bootstrap, lambda e: isinstance(e, NodeLease) and e.node_id == victim),
        f"a lease of {victim} to capture",
        30,
        every_s=0.5,
    )
    pid = info.pids[victim]
    os.kill(pid, signal.SIGSTOP)  # a hung host: its agent sends nothing more
    try:
        landed = asyncio.run(play_back(info.bootstrap, captured, times=14, every_s=1.0))  # past the 10 s LOST bound
        seen = status(info, victim)["status"]
        assert seen == "LOST", f"{victim} is {seen} after 14 s frozen, its last lease played back once a second"
    finally:
        os.kill(pid, signal.SIGCONT)
    wait.until(
        lambda: all("resource-pool" in replays_refused(info.bootstrap).get(copy, set()) for copy in landed),
        "each copy dead-lettered REPLAYED by the pool",
        30,
        every_s=1.0,
        describe=lambda: replays_refused(info.bootstrap),
    )
    wait.until(lambda: status(info, victim)["status"] == "ALIVE", f"{victim} ALIVE again once it runs", 60)


def drained_twice_and_the_undrain_captured(run_dir: Path, info: ClusterInfo, target: str) -> Captured:
    """Drain ``target``, undrain it, drain it again; the operator's undrain as an eavesdropper captured it."""
    for args in (("drain", target, "--wait"), ("drain", target, "--undo"), ("drain", target, "--wait")):
        done = cli(*args, run_dir=run_dir, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
    undrain = newest_record(
        info.bootstrap, lambda e: isinstance(e, NodeDrain) and e.node_id == target and not e.draining
    )
    assert undrain is not None, "the operator's undrain is in the log"
    assert FORGED_HEADER not in dict(undrain.headers)
    return undrain


def refused_and_still_drained(info: ClusterInfo, undrain: Captured, target: str) -> None:
    """Play ``undrain`` back once: the pool dead-letters it ``REPLAYED`` and ``target`` stays drained."""
    (copy,) = asyncio.run(play_back(info.bootstrap, undrain, times=1, every_s=0.0))
    wait.until(
        lambda: "resource-pool" in replays_refused(info.bootstrap).get(copy, set()),
        "the replayed undrain dead-lettered REPLAYED by the pool",
        30,
        every_s=1.0,
        describe=lambda: replays_refused(info.bootstrap),
    )
    # The pool refused it: the node stays drained (a state it had published would reach the monitor within 3 s).
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert status(info, target)["draining"] is True, f"{target} undrained by a replay"


@pytest.mark.timeout(300)
def test_a_captured_undrain_played_back_leaves_the_node_drained(cluster: tuple[Path, ClusterInfo]) -> None:
    (run_dir, info), target = cluster, "node-1"
    undrain = drained_twice_and_the_undrain_captured(run_dir, info, target)
    refused_and_still_drained(info, undrain, target)


def ps(run_dir: Path) -> dict[str, dict[str, Any]]:
    shown = cli("ps", "-o", "json", run_dir=run_dir)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    return {row["name"]: row for row in json.loads(shown.stdout)}


def restarted_and_ready(run_dir: Path, info: ClusterInfo, name: str) -> None:
    """SIGKILL ``name``; wait until the supervisor started it again and it announced itself."""
    before = ps(run_dir)[name]
    os.kill(before["pid"], signal.SIGKILL)
    again = wait.until(
        lambda: (row := ps(run_dir)[name])["running"] and row["pid"] != before["pid"] and row,
        f"{name} started again",
        60,
        every_s=0.5,
    )

    def announced() -> bool:
        services = get_json(f"{info.live().monitor_url}/api/services", timeout_s=2)["services"]
        return any(s["instance"] == name and s["pid"] == again["pid"] for s in services)

    wait.until(announced, f"{name} ready again", 60, every_s=0.5)


@pytest.mark.timeout(300)
def test_a_captured_undrain_played_back_after_the_pool_restarted_leaves_the_node_drained(
    cluster: tuple[Path, ClusterInfo],
) -> None:
    (run_dir, info), target = cluster, "node-0"
    undrain = drained_twice_and_the_undrain_captured(run_dir, info, target)
    restarted_and_ready(run_dir, info, "resource-pool-0")  # within the undrain's minute: its memory is gone
    refused_and_still_drained(info, undrain, target)
