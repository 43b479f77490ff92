"""The scheduler places a ready job's whole gang on nodes with the right GPUs and follows it to its end; an
assignment never answered is revoked at its start deadline and its gang recovered off the silent node; a started
shard its node stops reporting running is revoked as orphaned, and its GPUs come free."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import ASSIGNMENTS, LIFECYCLE, SERVICES, SHARD_EVENTS
from shardyard.events import (
    FailureCause,
    GpuStatus,
    JobFailed,
    JobReady,
    JobRecovering,
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
    ShardFailed,
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


def spec(job_id: str, model: str = "A100", count: int = 2, min_tflops: float = 35) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        task_type="micro_train",
        priority=5,
        gpu_count=count,
        gpu_model=model,
        min_tflops=min_tflops,
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


async def test_an_assignment_never_started_is_revoked_at_its_deadline_and_the_gang_recovered(
    bootstrap: str, log_dir: Path
) -> None:
    """An agent takes its assignment and hangs: at the start deadline the scheduler revokes the shard and fails it
    START_TIMEOUT; the fault manager re-forms the gang off that node; when the new attempt does not start either,
    the spent retry budget ends the job FAILED with both causes, and its GPUs are revoked."""
    await ensure_topics(bootstrap)
    job = "deadline-1"
    with (
        service("shardyard.scheduler", ["--start-deadline-s", "2"], bootstrap=bootstrap, log_dir=log_dir),
        service("shardyard.fault_manager", ["--max-retries", "1"], bootstrap=bootstrap, log_dir=log_dir),
    ):
        topics = [LIFECYCLE, ASSIGNMENTS, SHARD_EVENTS, SERVICES]
        async with Watcher(bootstrap, topics) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="scheduler", timeout_s=60)
            await watch.first(ServiceReady, service="fault-manager", timeout_s=60)
            for name in ("d-h100-a", "d-h100-b", "d-h100-c"):  # the only H100s: the job lands on two of them
                await send.event(node(name, "H100", 67))
            await send.event(JobReady(occurred_at=NOW, job_id=job, spec=spec(job, model="H100", min_tflops=60)))
            first = await watch.first(JobScheduled, job_id=job, attempt=1)
            answered, silent = (p.node_id for p in first.placements)
            await send.event(
                ShardStarted(occurred_at=NOW, job_id=job, shard_index=0, attempt=1, node_id=answered, pid=100)
            )

            timeout = await watch.first(ShardFailed, job_id=job, attempt=1, cause=FailureCause.START_TIMEOUT)
            assert (timeout.shard_index, timeout.node_id) == (1, silent)
            assert (timeout.occurred_at - first.occurred_at).total_seconds() >= 2.0
            revoked = await watch.until(
                lambda: [r for r in watch.of(ShardRevocation, job_id=job, attempt=1) if "start deadline" in r.message]
            )
            assert [(r.shard_index, r.node_id) for r in revoked] == [(1, silent)]  # the started shard is not

            plan = await watch.first(JobRecovering, job_id=job, attempt=1)
            assert plan.cause is FailureCause.START_TIMEOUT and plan.exclude_nodes == (silent,)
            second = await watch.first(JobScheduled, job_id=job, attempt=2)
            assert silent not in {p.node_id for p in second.placements}
            assert second.placements[0].node_id == answered  # the survivor keeps its GPU

            # Nobody answers the new attempt either: the retry budget (1) is spent and the job ends with the causes.
            ended = await watch.first(JobFailed, job_id=job)
            assert ended.cause is FailureCause.START_TIMEOUT
            assert {c.cause for c in ended.causes} == {FailureCause.START_TIMEOUT}
            assert (ended.causes[0].shard_index, ended.causes[0].node_id) == (1, silent)  # attempt 1's, then 2's
            await watch.until(
                lambda: {r.shard_index for r in watch.of(ShardRevocation, job_id=job, attempt=2)} == {0, 1}
            )
            failures = watch.of(ShardFailed, job_id=job, cause=FailureCause.START_TIMEOUT)
            assert len({(f.attempt, f.shard_index) for f in failures}) == len(failures), "each failed once"


async def test_a_started_shard_its_node_stops_reporting_is_revoked_as_orphaned_and_its_gpus_come_free(
    bootstrap: str, log_dir: Path
) -> None:
    """Both shards were reported started, so the start deadline is met, but their nodes' states never list them
    running (their agents restarted, say) and no end ever comes. Past the start deadline and the grace the scheduler
    revokes them and fails them ORPHANED; the fault manager recovers the gang in place (the nodes are alive); when
    that attempt does not start either the spent budget ends the job, and all three GPUs take a new job."""
    await ensure_topics(bootstrap)
    job = "orphan-1"
    scheduler_args = ["--start-deadline-s", "2", "--reservation-grace-s", "2"]
    with (
        service("shardyard.scheduler", scheduler_args, bootstrap=bootstrap, log_dir=log_dir),
        service("shardyard.fault_manager", ["--max-retries", "1"], bootstrap=bootstrap, log_dir=log_dir),
    ):
        topics = [LIFECYCLE, ASSIGNMENTS, SHARD_EVENTS, SERVICES]
        async with Watcher(bootstrap, topics) as watch, Producer(bootstrap) as send:
            await watch.until(lambda: len(watch.of(ServiceReady, service="scheduler")) >= 1, timeout_s=60)
            await watch.until(lambda: len(watch.of(ServiceReady, service="fault-manager")) >= 1, timeout_s=60)
            for name in ("o-h200-a", "o-h200-b", "o-h200-c"):  # the only H200s; their states list nothing running
                await send.event(node(name, "H200", 90))
            await send.event(JobReady(occurred_at=NOW, job_id=job, spec=spec(job, model="H200", min_tflops=80)))
            first = await watch.first(JobScheduled, job_id=job, attempt=1)
            training = {(p.shard_index, p.node_id) for p in first.placements if not p.spare}  # spares start nothing
            for shard in (p for p in first.placements if not p.spare):
                await send.event(
                    ShardStarted(
                        occurred_at=datetime.now(UTC),
                        job_id=job,
                        shard_index=shard.shard_index,
                        attempt=1,
                        node_id=shard.node_id,
                        pid=200 + shard.shard_index,
                    )
                )
            await watch.first(JobRunning, job_id=job, attempt=1)

            orphaned = await watch.until(
                lambda: (
                    len(found := watch.of(ShardFailed, job_id=job, attempt=1, cause=FailureCause.ORPHANED)) == 2
                    and found
                ),
                what="both shards failed ORPHANED",
            )
            assert {(f.shard_index, f.node_id) for f in orphaned} == training
            assert all((f.occurred_at - first.occurred_at).total_seconds() > 2 + 2 for f in orphaned)
            revoked = await watch.until(
                lambda: (
                    len(
                        found := [
                            r for r in watch.of(ShardRevocation, job_id=job, attempt=1) if "orphaned" in r.message
                        ]
                    )
                    == 2
                    and found
                ),
                what="both orphans revoked",
            )
            assert {(r.shard_index, r.node_id) for r in revoked} == training

            plan = await watch.first(JobRecovering, job_id=job, attempt=1)
            assert plan.cause is FailureCause.ORPHANED and plan.exclude_nodes == ()
            second = await watch.first(JobScheduled, job_id=job, attempt=2)
            retaken = {p.node_id for p in second.placements if not p.spare}
            assert retaken == {node_id for _, node_id in training}  # the orphans' GPUs came free: taken again

            await watch.first(JobFailed, job_id=job, timeout_s=60)  # attempt 2 never starts: the budget is spent
            await send.event(JobReady(occurred_at=NOW, job_id="orphan-2", spec=spec("orphan-2", "H200", 3, 80)))
            third = await watch.first(JobScheduled, job_id="orphan-2")
            assert {p.node_id for p in third.placements} == {"o-h200-a", "o-h200-b", "o-h200-c"}
