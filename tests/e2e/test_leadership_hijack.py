"""A leadership taken by a member that is no sealed replica is seen, against a real cluster (``shardyard up``, two
scheduler replicas). A plain Kafka client, holding no cluster secret, joins ``shardyard-scheduler-leader`` with the
scheduler's own group protocol and claims a held term of 10^9, as in the issue that stopped all scheduling for 45 s
silently. On Kafka with ACLs only the scheduler's principal may join (``test_kafka_acls``); the client here speaks
as the broker's admin, as an attacker holding the broker's keys, or any client of a broker without ACLs, would.

LEADERSHIP_HIJACKED fires within 10 s; once the client leaves, a sealed replica leads again and the alert ends."""

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from shardyard.bus.leadership import group_of, sticky_assignor
from shardyard.bus.topics import LEADERSHIP
from shardyard.bus.transport import client_options
from shardyard.cli.cluster import ClusterInfo, get_json
from shardyard.cli.cluster_info import ADMIN_PRINCIPAL
from tests.support import wait
from tests.support.cluster import cli, speaking_as

pytestmark = [pytest.mark.slow, pytest.mark.broker]

DETECTED_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterInfo]:
    run_dir = tmp_path_factory.mktemp("hijack")
    started = cli("up", "--node", "A100:1", run_dir=run_dir, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        info = ClusterInfo.load(run_dir)
        with speaking_as(info, ADMIN_PRINCIPAL):
            yield info
    finally:
        cli("down", run_dir=Path(run_dir), timeout=120)


def firing(info: ClusterInfo, rule: str) -> list[dict[str, Any]]:
    try:
        answer = get_json(f"{info.live().monitor_url}/api/alerts")
    except (OSError, ValueError):
        return []
    return [a for a in answer.get("firing", []) if a.get("rule") == rule]


async def hijack(bootstrap: str, hold_s: float, seen: "asyncio.Event") -> float:
    """Join the scheduler's leader group with a huge held term, hold the partition ``hold_s``; when it was taken."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id="mallory",
        group_id=group_of("scheduler"),
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
        partition_assignment_strategy=(sticky_assignor(lambda: 10**9),),
        **client_options(),
    )
    await consumer.start()
    consumer.subscribe([LEADERSHIP.name])
    try:
        deadline = time.monotonic() + 60
        while not consumer.assignment():
            assert time.monotonic() < deadline, "the group never gave the hijacker the partition"
            await consumer.getmany(timeout_ms=200)
        taken = time.monotonic()
        seen.set()
        while time.monotonic() < taken + hold_s:
            await consumer.getmany(timeout_ms=200)
        return taken
    finally:
        await consumer.stop()  # leaves the group: a sealed replica is elected again


@pytest.mark.timeout(300)
def test_a_member_that_is_no_sealed_replica_holding_the_leadership_fires_leadership_hijacked(
    cluster: ClusterInfo,
) -> None:
    info = cluster
    wait.until(lambda: get_json(f"{info.live().monitor_url}/api/services"), "the monitor answers", 60)
    assert not firing(info, "LEADERSHIP_HIJACKED")
    found: dict[str, float] = {}
    alerts: list[dict[str, Any]] = []

    async def attack() -> float:
        seen = asyncio.Event()
        task = asyncio.create_task(hijack(info.bootstrap, 20.0, seen))
        await seen.wait()
        while not (fired := firing(info, "LEADERSHIP_HIJACKED")):
            assert not task.done(), "the hijacker let go before the alert fired"
            await asyncio.sleep(0.25)
        found["alerted"] = time.monotonic()
        alerts.extend(fired)  # as it fired: it may have ended by the time the hijacker lets go
        return await task

    taken = asyncio.run(attack())
    print(f"\nLEADERSHIP_HIJACKED {found['alerted'] - taken:.1f} s after the hijacker took the partition")
    assert found["alerted"] - taken <= DETECTED_WITHIN_S, f"LEADERSHIP_HIJACKED {found['alerted'] - taken:.1f} s late"
    (alert,) = alerts
    assert alert["subject"] == "scheduler" and "mallory" in alert["summary"], alert
    wait.until(lambda: not firing(info, "LEADERSHIP_HIJACKED"), "the alert to end once a replica leads again", 60)
    assert not firing(info, "NO_LEADER")
