"""The fault manager as a process on a real broker: a killed shard becomes a recovery plan, a user error ends the
job, a node that goes SUSPECT under a gang recovers it without it, COMM_ERRORs alone wait out their grace, the spare
ratio follows the failures; a restarted replica decides nothing twice and keeps the ratio."""

from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import LIFECYCLE, REDUNDANCY, SERVICES, SHARD_EVENTS
from shardyard.events import (
    FailureCause,
    GpuStatus,
    JobFailed,
    JobRecovering,
    JobScheduled,
    NodeState,
    NodeStatus,
    RedundancyChanged,
    ServiceReady,
    ShardFailed,
    ShardPlacement,
    ShardStarted,
)
from tests.support.events import Producer, Watcher
from tests.support.processes import service
from tests.support.replicas import one_key_per_partition, two_replicas

pytestmark = pytest.mark.broker


def now() -> datetime:
    return datetime.now(UTC)


def gang(job_id: str, *nodes: str) -> JobScheduled:
    return JobScheduled(
        occurred_at=now(),
        job_id=job_id,
        attempt=1,
        term=1,
        coordinator_node=nodes[0],
        rendezvous_port=29500,
        placements=tuple(
            ShardPlacement(shard_index=i, node_id=n, gpu_indices=(0,), gpu_model="A100", match_score=1.0)
            for i, n in enumerate(nodes)
        ),
    )


def shard_failed(job_id: str, shard_index: int, node_id: str, cause: FailureCause) -> ShardFailed:
    return ShardFailed(
        occurred_at=now(),
        job_id=job_id,
        shard_index=shard_index,
        attempt=1,
        node_id=node_id,
        cause=cause,
        exit_code=None,
        message=f"{cause.value.lower()} in test",
    )


def node(node_id: str, status: NodeStatus) -> NodeState:
    return NodeState(
        occurred_at=now(),
        node_id=node_id,
        status=status,
        agent_instance="a",
        host="test",
        address="127.0.0.1",
        rendezvous_ports=(31000, 4),
        last_heartbeat_at=now(),
        gpus=(GpuStatus(index=0, model="A100", tflops=35, memory_bytes=80 * 1024**3),),
        cpu_cores=16,
        memory_bytes=128 * 1024**3,
        cpu_load=0.1,
    )


async def test_failures_become_plans_or_ends_and_set_the_spare_ratio(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    run = uuid4().hex[:8]
    names = ("killed", "user", "frozen", "comm", "silent", "mark")
    killed, user, frozen, comm, silent, marker = (f"fm-{name}-{run}" for name in names)
    n1, n2, n3, n4 = (f"fm-n{i}-{run}" for i in range(1, 5))
    args = ["--comm-grace-s", "1", "--silent-grace-s", "2.5", "--redundancy-window-s", "120"]
    started_at = now()

    async with Watcher(bootstrap, [LIFECYCLE, REDUNDANCY, SERVICES]) as watch, Producer(bootstrap) as send:
        with service(
            "shardyard.fault_manager", [*args, "--instance", f"fm-{run}-1"], bootstrap=bootstrap, log_dir=log_dir
        ):
            await watch.until(lambda: watch.of(ServiceReady, instance=f"fm-{run}-1"), timeout_s=60, what="ready")

            # A killed shard: one recovery plan, at once, without excluding its node.
            await send.event(gang(killed, n1, n2))
            for i, n in enumerate((n1, n2)):
                await send.event(
                    ShardStarted(occurred_at=now(), job_id=killed, shard_index=i, attempt=1, node_id=n, pid=1)
                )
            await send.event(shard_failed(killed, 1, n2, FailureCause.KILLED))
            plan = await watch.first(JobRecovering, job_id=killed)
            assert (plan.attempt, plan.cause, plan.exclude_nodes) == (1, FailureCause.KILLED, ())
            assert (plan.retries_used, plan.retries_left) == (1, 2)
            assert plan.retry_at <= now()

            # The user's own error: the job ends at once.
            await send.event(shard_failed(user, 0, n3, FailureCause.USER_ERROR))
            ended = await watch.first(JobFailed, job_id=user)
            assert ended.cause is FailureCause.USER_ERROR and "user_error in test" in ended.message

            # A node that goes silent under a gang (no shard reports anything): recovered without it.
            await send.event(gang(frozen, n3, n4))
            await send.event(node(n4, NodeStatus.SUSPECT))
            plan = await watch.first(JobRecovering, job_id=frozen)
            assert (plan.cause, plan.exclude_nodes) == (FailureCause.NODE_LOST, (n4,))

            # COMM_ERRORs alone: held for the grace, then recovered without exclusion; while a shard of the gang
            # says nothing (its node may be down, its verdict to come), held for the longer silent grace.
            await send.event(gang(comm, n1, n3))
            await send.event(gang(silent, n1, n3))
            sent = now()
            for i, n in enumerate((n1, n3)):
                await send.event(shard_failed(comm, i, n, FailureCause.COMM_ERROR))
            await send.event(shard_failed(silent, 0, n1, FailureCause.COMM_ERROR))
            plan = await watch.first(JobRecovering, job_id=comm)
            assert (plan.cause, plan.exclude_nodes) == (FailureCause.COMM_ERROR, ())
            assert (plan.occurred_at - sent).total_seconds() >= 1.0
            plan = await watch.first(JobRecovering, job_id=silent)
            assert (plan.cause, plan.exclude_nodes) == (FailureCause.COMM_ERROR, ())
            assert (plan.occurred_at - sent).total_seconds() >= 2.5

            # The failures moved the spare ratio off zero.
            def raised() -> list[RedundancyChanged]:
                return [c for c in watch.of(RedundancyChanged) if c.occurred_at >= started_at and c.ratio > 0]

            change = (await watch.until(raised, what="a raised spare ratio"))[-1]
            assert change.shard_failures >= 1 and change.shard_attempts >= 2 and change.ratio <= 0.5
            changes_before_restart = len(watch.of(RedundancyChanged))

        with service(
            "shardyard.fault_manager", [*args, "--instance", f"fm-{run}-2"], bootstrap=bootstrap, log_dir=log_dir
        ):
            await watch.until(lambda: watch.of(ServiceReady, instance=f"fm-{run}-2"), timeout_s=60, what="restart")
            await send.event(shard_failed(marker, 0, n1, FailureCause.USER_ERROR))
            await watch.first(JobFailed, job_id=marker)

            for job_id in (killed, frozen, comm, silent):
                assert len(watch.of(JobRecovering, job_id=job_id)) == 1, f"{job_id} decided again after the restart"
            assert len(watch.of(JobFailed, job_id=user)) == 1
            assert len(watch.of(RedundancyChanged)) == changes_before_restart, "the ratio was restored, not re-set"


async def test_two_replicas_split_the_jobs_and_one_takes_them_all_over_when_the_other_dies(
    bootstrap: str, log_dir: Path
) -> None:
    await ensure_topics(bootstrap)
    run = uuid4().hex[:8]

    async def fail_each(jobs: dict[int, str]) -> None:
        for job_id in jobs.values():
            await send.event(gang(job_id, "fm-split-n1", "fm-split-n2"))
            await send.event(shard_failed(job_id, 1, "fm-split-n2", FailureCause.KILLED))
        for job_id in jobs.values():
            await watch.first(JobRecovering, job_id=job_id, timeout_s=30)

    async with Watcher(bootstrap, [LIFECYCLE, SERVICES]) as watch, Producer(bootstrap) as send:
        split = two_replicas(
            "shardyard.fault_manager",
            f"fm-split-{run}",
            SHARD_EVENTS,
            bootstrap=bootstrap,
            log_dir=log_dir,
            watch=watch,
        )
        async with split as replicas:
            before = one_key_per_partition(f"fm-before-{run}", SHARD_EVENTS)
            await fail_each(before)
            assert replicas.both_published(LIFECYCLE)  # both replicas decided

            await replicas.kill_the_first(watch)
            after = one_key_per_partition(f"fm-after-{run}", SHARD_EVENTS)
            await fail_each(after)

            for job_id in [*before.values(), *after.values()]:
                assert len(watch.of(JobRecovering, job_id=job_id)) == 1, f"{job_id} decided twice"
