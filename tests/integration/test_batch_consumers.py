"""Batch consumption keeps the guarantees of one-at-a-time consumption, on a real broker: a replica killed in the
middle of a batch loses no message (its batch was never committed, so the group reads it again), and a resource-pool
replica that fell behind by seconds of heartbeats catches up without suspecting a live node."""

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from shardyard.bus.admin import ensure_topics
from shardyard.bus.codec import encode
from shardyard.bus.topics import HEARTBEATS, NODE_STATE, SERVICES, Topic
from shardyard.events import GpuStatus, Heartbeat, HeartbeatEvent, NodeState, NodeStatus, ServiceReady
from tests.support import wait
from tests.support.events import Watcher
from tests.support.processes import service
from tests.support.replicas import consumed
from tests.support.runners import free_port

pytestmark = pytest.mark.broker

ROOT = Path(__file__).parents[2]


def heartbeat(node_id: str, seq: int) -> Heartbeat:
    gpus = tuple(
        GpuStatus(index=i, model="A100", tflops=35, memory_bytes=80 * 1024**3, simulated=True) for i in range(8)
    )
    return Heartbeat(
        occurred_at=datetime.now(UTC),
        node_id=node_id,
        agent_instance=f"{node_id}-agent",
        seq=seq,
        host="test",
        address="127.0.0.1",
        rendezvous_ports=(30000, 10),
        gpus=gpus,
        cpu_cores=64,
        memory_bytes=512 * 1024**3,
        cpu_load=0.1,
    )


def seqs(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


async def test_a_replica_killed_in_the_middle_of_a_batch_loses_no_message(bootstrap: str, tmp_path: Path) -> None:
    topic = Topic(f"shardyard.test.batches.{uuid.uuid4().hex[:8]}", 1, "node id", HeartbeatEvent)
    await ensure_topics(bootstrap, [topic])
    total, batch, die_at = 1500, 500, 700  # the kill comes inside the second batch (events 501..1000)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=5)
    await producer.start()
    try:
        sent = [await producer.send(topic.name, encode(heartbeat("n", seq)), key=b"n") for seq in range(total)]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    group = f"batch-test-{uuid.uuid4().hex[:8]}"
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"

    def consumer(out: Path, *extra: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "tests.support.batch_consumer", bootstrap, topic.name, group, str(out)]
        return subprocess.Popen([*argv, "--max-records", str(batch), *extra], cwd=ROOT)

    dying = consumer(first, "--die-at", str(die_at))
    try:
        assert dying.wait(timeout=60) == 9  # it killed itself mid-batch
    finally:
        if dying.poll() is None:
            dying.kill()
    assert len(seqs(first)) == die_at

    survivor = consumer(second)
    try:
        await wait.eventually(
            lambda: set(seqs(second)) >= set(range(die_at, total)), "the rest of the topic", 60, every_s=0.1
        )
    finally:
        survivor.send_signal(signal.SIGTERM)
        survivor.wait(timeout=15)
    handled = seqs(first) + seqs(second)
    assert set(handled) == set(range(total))  # nothing lost
    redelivered = set(seqs(first)) & set(seqs(second))
    # The killed batch (whose offsets were never committed) came again; the batch before it, committed, did not.
    assert min(seqs(second)) <= seqs(first)[-1] and redelivered
    assert min(seqs(second)) > 0


async def test_a_pool_replica_that_fell_behind_catches_up_without_suspecting_a_live_node(
    bootstrap: str, log_dir: Path
) -> None:
    await ensure_topics(bootstrap)
    nodes = [f"backlog-n{i}" for i in range(400)]
    port = free_port()
    stopped_s = 6.0  # paused twice the suspicion bound: a backlog of 2,400 heartbeats
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=5)
    await producer.start()
    sent = 0

    async def beat() -> None:
        """Every node heartbeats at 1 Hz, spread over the second, as agents do."""
        nonlocal sent
        seq = 0
        while True:
            seq += 1
            began = time.monotonic()
            for n, node in enumerate(nodes):
                await producer.send(HEARTBEATS.name, encode(heartbeat(node, seq)), key=node.encode())
                sent += 1
                await asyncio.sleep(max(0.0, began + (n + 1) / len(nodes) - time.monotonic()))

    async with Watcher(bootstrap, [NODE_STATE, SERVICES]) as watch:
        args = ["--instance", "backlog-pool", "--metrics-port", str(port)]
        with service("shardyard.resource_pool", args, bootstrap=bootstrap, log_dir=log_dir) as pool:
            await watch.until(lambda: watch.of(ServiceReady, instance="backlog-pool"), timeout_s=60)
            beats = asyncio.create_task(beat())
            try:
                await watch.until(
                    lambda: {s.node_id for s in watch.of(NodeState, status=NodeStatus.ALIVE)} >= set(nodes),
                    timeout_s=30,
                    what="every node ALIVE",
                )
                os.kill(pool.pid, signal.SIGSTOP)
                await asyncio.sleep(stopped_s)  # the outage itself: heartbeats pile up meanwhile
                behind = sent
                os.kill(pool.pid, signal.SIGCONT)
                await wait.eventually(lambda: consumed(port, HEARTBEATS) >= behind, "the backlog read", 30, every_s=0.1)
                caught_up_at, backlog = sent, behind
                await wait.eventually(
                    lambda: consumed(port, HEARTBEATS) >= caught_up_at + len(nodes) * 4, "4 s more", 30, every_s=0.1
                )
            finally:
                beats.cancel()
                await producer.stop()
    misjudged = {s.node_id for s in watch.of(NodeState) if s.status is not NodeStatus.ALIVE}
    assert backlog >= len(nodes) * (stopped_s - 1)
    assert misjudged == set()
