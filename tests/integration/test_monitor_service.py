"""The monitor folds every topic into its status API and /metrics."""

import asyncio
import json
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from shardyard.broker.ports import free_port
from shardyard.bus.admin import ensure_topics
from shardyard.bus.assigned import partitions_of
from shardyard.bus.topics import DEADLETTER, HEARTBEATS, SERVICES
from shardyard.events import (
    GpuStatus,
    Heartbeat,
    JobAccepted,
    JobRejected,
    JobSpec,
    JobUnschedulable,
    JobWaiting,
    NodeDrain,
    NodeState,
    NodeStatus,
    PendingReason,
    RejectReason,
    ServiceReady,
)
from tests.support.events import Producer, Watcher, eventually
from tests.support.processes import service

pytestmark = pytest.mark.broker


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


async def test_status_api_and_metrics(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    port = free_port()
    with service("shardyard.monitor", ["--http-port", str(port)], bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="monitor", timeout_s=60)
            await send.event(
                JobRejected(
                    occurred_at=datetime.now(UTC),
                    job_id="mon-bad",
                    reason=RejectReason.WRONG_TYPE,
                    message="invalid submission: resource_requirements.gpu.count: Input should be a valid integer",
                    source_offset="t/0/0",
                )
            )
            base = f"http://127.0.0.1:{port}"

            async def rejected_visible() -> dict[str, object]:
                for _ in range(200):
                    try:
                        return dict(json.loads(await asyncio.to_thread(get, f"{base}/api/jobs/mon-bad")))
                    except OSError:
                        await asyncio.sleep(0.05)
                raise AssertionError("the monitor never showed the rejected job")

            job = await rejected_visible()
            assert job["state"] == "REJECTED" and job["reason"] == "WRONG_TYPE"
            metrics = (await asyncio.to_thread(get, f"{base}/metrics")).decode()
            assert 'shardyard_jobs{state="REJECTED"} 1.0' in metrics
            services = json.loads(await asyncio.to_thread(get, f"{base}/api/services"))
            assert any(s["service"] == "monitor" for s in services["services"])


async def records_in(bootstrap: str, topic: str) -> int:
    """How many records ``topic`` holds (its partitions' end offsets: nothing here is ever deleted)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        partitions = await partitions_of(consumer, [topic])
        ends: dict[TopicPartition, int] = await consumer.end_offsets(partitions)
        return sum(ends.values())
    finally:
        await consumer.stop()


def heartbeat(node_id: str, now: datetime) -> Heartbeat:
    return Heartbeat(
        occurred_at=now,
        node_id=node_id,
        agent_instance="a",
        seq=1,
        host="h",
        address="127.0.0.1",
        rendezvous_ports=(30000, 4),
        gpus=(GpuStatus(index=0, model="A100", tflops=35, memory_bytes=1),),
        cpu_cores=4,
        memory_bytes=1,
        cpu_load=0.1,
    )


def spec(job_id: str, priority: int) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        task_type="micro_train",
        priority=priority,
        gpu_count=1,
        gpu_model="A100",
        min_tflops=35,
        memory_bytes=0,
        cpu_cores=1,
        model_path="/m",
        dataset_path="/d",
        shard_count=1,
        sync_interval=10,
        max_steps=10,
        batch_size=1,
        seq_len=8,
        lr=0.001,
        seed=0,
        submitted_at=datetime.now(UTC),
        depends_on=("mon-parent",),
    )


async def test_pending_reasons_drain_and_queue_metrics(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    now = datetime.now(UTC)
    counts = {"GPU model mismatch": 2, "no free GPU": 1}
    async with Producer(bootstrap) as send:
        await send.event(heartbeat("mon-n0", now))  # before the monitor starts: past heartbeats are not replayed
    args = ["--http-port", str(port), "--instance", "mon-pending"]
    with service("shardyard.monitor", args, bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [SERVICES]) as watch, Producer(bootstrap) as send:
            # This replica's own announcement (the module's broker holds the previous test's): it reads from here on.
            await watch.first(ServiceReady, service="monitor", instance="mon-pending", timeout_s=60)
            # Operators' drain requests share the heartbeats topic with the agents' heartbeats: both are folded in.
            await send.event(NodeDrain(occurred_at=now, node_id="mon-n1", draining=True))
            await send.event(heartbeat("mon-n1", now))
            for job_id, priority in (("mon-wait", 3), ("mon-nofit", 7)):
                await send.event(
                    JobAccepted(occurred_at=now, job_id=job_id, spec=spec(job_id, priority), source_offset="t/0/1")
                )
            await send.event(
                JobWaiting(
                    occurred_at=now,
                    job_id="mon-wait",
                    reason=PendingReason.WAITING_FOR_DEPENDENCY,
                    message="waiting for dependency to succeed: 'mon-parent'",
                    waiting_for=("mon-parent",),
                )
            )
            await send.event(
                JobUnschedulable(
                    occurred_at=now, job_id="mon-nofit", reason=PendingReason.NO_FIT, message="0/3", node_counts=counts
                )
            )
            gpu = GpuStatus(index=0, model="A100", tflops=33.3, memory_bytes=1, tflops_source="measured")
            await send.event(
                NodeState(
                    occurred_at=now,
                    node_id="mon-n1",
                    status=NodeStatus.ALIVE,
                    agent_instance="a",
                    host="h",
                    address="127.0.0.1",
                    rendezvous_ports=(30000, 4),
                    last_heartbeat_at=now,
                    gpus=(gpu,),
                    cpu_cores=4,
                    memory_bytes=1,
                    cpu_load=0.1,
                    artifacts={"/m": "local"},
                    topology={"zone": "z1"},
                    draining=True,
                )
            )

            async def job(job_id: str, key: str) -> dict[str, Any] | None:
                found: dict[str, Any] = json.loads(await asyncio.to_thread(get, f"{base}/api/jobs/{job_id}"))
                return found if found.get(key) else None

            waiting = await eventually(lambda: job("mon-wait", "waiting_for"), "the waiting job's parents")
            assert (waiting["state"], waiting["reason"]) == ("WAITING", "WAITING_FOR_DEPENDENCY")
            assert waiting["waiting_for"] == ["mon-parent"]
            nofit = await eventually(lambda: job("mon-nofit", "node_counts"), "the node counts")
            assert (nofit["reason"], nofit["message"], nofit["node_counts"]) == ("NO_FIT", "0/3", counts)

            async def drained() -> dict[str, Any] | None:
                nodes = json.loads(await asyncio.to_thread(get, f"{base}/api/nodes"))["nodes"]
                return next((n for n in nodes if n["node_id"] == "mon-n1"), None)

            node = await eventually(drained, "the drained node")
            assert (node["draining"], node["topology"], node["artifact_count"]) == (True, {"zone": "z1"}, 1)
            assert (node["gpus"][0]["tflops"], node["gpus"][0]["tflops_source"]) == (33.3, "measured")

            metrics = (await asyncio.to_thread(get, f"{base}/metrics")).decode().splitlines()
            assert 'shardyard_queue_jobs{priority="3",reason="WAITING_FOR_DEPENDENCY"} 1.0' in metrics
            assert 'shardyard_queue_jobs{priority="7",reason="NO_FIT"} 1.0' in metrics
            assert "shardyard_nodes_draining 1.0" in metrics
            assert "shardyard_cancellations_total 0.0" in metrics
            folded = f'shardyard_monitor_events_total{{topic="{HEARTBEATS.name}"}} 2.0'

            async def both_folded() -> bool:
                return folded in (await asyncio.to_thread(get, f"{base}/metrics")).decode().splitlines()

            await eventually(both_folded, "the drain request and the heartbeat folded in, not the earlier heartbeat")
            assert await records_in(bootstrap, DEADLETTER.name) == 0
