"""The scheduler places a ready job's whole gang on nodes with the right GPUs and follows it to its end."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import ASSIGNMENTS, LIFECYCLE, SERVICES
from shardyard.events import (
    FailureCause,
    GpuStatus,
    JobFailed,
    JobReady,
    JobRunning,
    JobScheduled,
    JobSpec,
    JobSucceeded,
    JobUnschedulable,
    NodeState,
    NodeStatus,
    PendingReason,
    ServiceReady,
    ShardAssignment,
    ShardCompleted,
    ShardRevocation,
    ShardStarted,
)
from tests.support.events import Producer, Watcher
from tests.support.processes import service

pytestmark = pytest.mark.broker
NOW = datetime.now(UTC)


def node(node_id: str, model: str, tflops: float, gpus: int = 1) -> NodeState:
    return NodeState(
        occurred_at=NOW,
        node_id=node_id,
        status=NodeStatus.ALIVE,
        agent_instance="a",
        host="test",
        address=f"10.0.0.{len(node_id)}",
        rendezvous_ports=(31000, 4),
        last_heartbeat_at=NOW,
        gpus=tuple(GpuStatus(index=i, model=model, tflops=tflops, memory_bytes=80 * 1024**3) for i in range(gpus)),
        cpu_cores=16,
        memory_bytes=128 * 1024**3,
        cpu_load=0.1,
        artifacts={"/data/models/m": "shared", "/data/datasets/d": "shared"},
    )


def spec(job_id: str, model: str = "A100", count: int = 2) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        task_type="micro_train",
        priority=5,
        gpu_count=count,
        gpu_model=model,
        min_tflops=35,
        memory_bytes=64 * 1024**3,
        cpu_cores=8,
        model_path="/data/models/m",
        dataset_path="/data/datasets/d",
        shard_count=count,
        sync_interval=100,
        max_steps=300,
        batch_size=8,
        seq_len=64,
        lr=3e-3,
        seed=0,
        submitted_at=NOW - timedelta(seconds=1),
    )


async def test_places_on_a100s_and_follows_the_gang(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    with service("shardyard.scheduler", [], bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [LIFECYCLE, ASSIGNMENTS, SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="scheduler", timeout_s=60)
            for state in (
                node("s-v100", "V100", 15, gpus=4),
                node("s-a100-a", "A100", 35),
                node("s-a100-b", "A100", 35),
            ):
                await send.event(state)
            await send.event(JobReady(occurred_at=NOW, job_id="sched-1", spec=spec("sched-1")))
            scheduled = await watch.first(JobScheduled, job_id="sched-1")
            assert {p.node_id for p in scheduled.placements} == {"s-a100-a", "s-a100-b"}
            assignments = await watch.until(
                lambda: (
                    len(watch.of(ShardAssignment, job_id="sched-1")) == 2
                    and watch.of(ShardAssignment, job_id="sched-1")
                )
            )
            assert {a.shard_index for a in assignments} == {0, 1}
            assert all(a.term >= 1 and a.attempt == 1 and a.world_size == 2 for a in assignments)
            assert len({(a.master_addr, a.master_port) for a in assignments}) == 1

            # A second A100 job cannot fit now: it waits with a reason instead of landing on the V100s.
            await send.event(JobReady(occurred_at=NOW, job_id="sched-2", spec=spec("sched-2")))
            pending = await watch.first(JobUnschedulable, job_id="sched-2")
            assert pending.reason in (
                PendingReason.NO_FIT,
                PendingReason.INSUFFICIENT_GPUS,
                PendingReason.GPU_MODEL_MISMATCH,
            )
            assert "GPU model mismatch" in pending.node_counts

            for index in (0, 1):
                await send.event(
                    ShardStarted(
                        occurred_at=NOW,
                        job_id="sched-1",
                        shard_index=index,
                        attempt=1,
                        node_id=scheduled.placements[index].node_id,
                        pid=100 + index,
                    )
                )
            await watch.first(JobRunning, job_id="sched-1")
            for index in (0, 1):
                await send.event(
                    ShardCompleted(
                        occurred_at=NOW,
                        job_id="sched-1",
                        shard_index=index,
                        attempt=1,
                        node_id=scheduled.placements[index].node_id,
                        final_loss=1.5,
                        steps=300,
                        checkpoint_dir="/data/checkpoints/sched-1",
                    )
                )
            succeeded = await watch.first(JobSucceeded, job_id="sched-1")
            assert succeeded.final_loss == 1.5
            # The freed A100s go to the waiting job at once.
            second = await watch.first(JobScheduled, job_id="sched-2")
            assert {p.node_id for p in second.placements} == {"s-a100-a", "s-a100-b"}

            # A failed job's remaining shards are revoked.
            await send.event(
                JobFailed(
                    occurred_at=NOW, job_id="sched-2", attempt=1, cause=FailureCause.USER_ERROR, message="bad data"
                )
            )
            revoked = await watch.until(
                lambda: (
                    len(watch.of(ShardRevocation, job_id="sched-2")) == 2
                    and watch.of(ShardRevocation, job_id="sched-2")
                )
            )
            assert {r.node_id for r in revoked} == {"s-a100-a", "s-a100-b"}
