"""Two scheduler replicas, one leader elected through Kafka: the standby takes over when the leader is killed or
paused, under a higher term, and a paused leader that resumes publishes nothing."""

import os
import signal
import time
from pathlib import Path

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import ASSIGNMENTS, LIFECYCLE, SERVICES
from shardyard.events import JobReady, JobScheduled, LeaderElected, ServiceReady, ShardAssignment
from tests.integration.test_scheduler_service import NOW, node, spec
from tests.support.events import Producer, Watcher
from tests.support.processes import service

pytestmark = pytest.mark.broker


def leader_pid(watch: Watcher, pids: dict[str, int], after_term: int = 0) -> tuple[LeaderElected, int] | None:
    """The latest leader among this test's replicas (the topic also holds earlier tests' elections)."""
    newer = [e for e in watch.of(LeaderElected, service="scheduler") if e.term > after_term and e.instance in pids]
    if not newer:
        return None
    latest = max(newer, key=lambda e: e.term)
    return latest, pids[latest.instance]


async def test_standby_takes_over_a_killed_leader_with_a_higher_term(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    replicas = ("kill-r0", "kill-r1")
    with (
        service("shardyard.scheduler", ["--instance", replicas[0]], bootstrap=bootstrap, log_dir=log_dir) as r0,
        service("shardyard.scheduler", ["--instance", replicas[1]], bootstrap=bootstrap, log_dir=log_dir) as r1,
    ):
        pids = {replicas[0]: r0.pid, replicas[1]: r1.pid}
        async with Watcher(bootstrap, [LIFECYCLE, ASSIGNMENTS, SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.until(lambda: len(watch.of(ServiceReady, service="scheduler")) == 2, timeout_s=60)
            for state in (node("f-a100-a", "A100", 35), node("f-a100-b", "A100", 35), node("f-a100-c", "A100", 35)):
                await send.event(state)
            await send.event(JobReady(occurred_at=NOW, job_id="fo-1", spec=spec("fo-1")))
            first = await watch.first(JobScheduled, job_id="fo-1", timeout_s=30)
            elected, victim = await watch.until(lambda: leader_pid(watch, pids), what="a leader")
            # The leader placed it, or one that claimed again since (a lease renewal too slow on a loaded host ends a
            # term; the replica holding the partition then leads under the next one): the one killed leads now.
            assert first.term <= elected.term

            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            await send.event(JobReady(occurred_at=NOW, job_id="fo-2", spec=spec("fo-2", count=1)))
            assignment = await watch.first(ShardAssignment, job_id="fo-2", timeout_s=30)
            failover_s = time.monotonic() - killed_at
            successor, _ = await watch.until(lambda: leader_pid(watch, pids, elected.term), what="a new leader")

            assert successor.instance != elected.instance
            assert assignment.term == successor.term > elected.term
            # The new leader knew the first gang from the log: the second job went to the third node.
            assert assignment.node_id not in {p.node_id for p in first.placements}
            assert failover_s < 10, f"failover took {failover_s:.1f} s"
            # One placement per job: the take-over repeated nothing.
            assert len(watch.of(JobScheduled, job_id="fo-1")) == 1


async def test_a_paused_leader_is_replaced_and_resumes_without_acting(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    replicas = ("pause-r0", "pause-r1")
    with (
        service("shardyard.scheduler", ["--instance", replicas[0]], bootstrap=bootstrap, log_dir=log_dir) as r0,
        service("shardyard.scheduler", ["--instance", replicas[1]], bootstrap=bootstrap, log_dir=log_dir) as r1,
    ):
        pids = {replicas[0]: r0.pid, replicas[1]: r1.pid}
        async with Watcher(bootstrap, [LIFECYCLE, ASSIGNMENTS, SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.until(lambda: len(watch.of(ServiceReady, service="scheduler")) == 2, timeout_s=60)
            elected, paused = await watch.until(lambda: leader_pid(watch, pids), what="a leader", timeout_s=30)
            for state in (node("p-a100-a", "A100", 35), node("p-a100-b", "A100", 35), node("p-a100-c", "A100", 35)):
                await send.event(state)

            os.kill(paused, signal.SIGSTOP)
            try:
                successor, _ = await watch.until(
                    lambda: leader_pid(watch, pids, elected.term), what="a new leader", timeout_s=30
                )
                await send.event(JobReady(occurred_at=NOW, job_id="ps-1", spec=spec("ps-1")))
                scheduled = await watch.first(JobScheduled, job_id="ps-1", timeout_s=30)
                assert scheduled.term == successor.term
            finally:
                os.kill(paused, signal.SIGCONT)
            # The resumed replica finds its lease gone: nothing more goes out under the old term.
            await send.event(JobReady(occurred_at=NOW, job_id="ps-2", spec=spec("ps-2", count=1)))
            await watch.first(JobScheduled, job_id="ps-2", timeout_s=30)
            ours = [e for kind in (JobScheduled, ShardAssignment) for e in watch.of(kind) if e.job_id.startswith("ps-")]
            stale = [e for e in ours if e.term <= elected.term]
            assert stale == []
            assert len(watch.of(JobScheduled, job_id="ps-1")) == 1
