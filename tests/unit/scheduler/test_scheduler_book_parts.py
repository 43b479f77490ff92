"""The parts of the scheduler book that own state: the fence's record of placements, the cancel requests kept for
later, the reasons shown for pending jobs, the orphan check's pace and a gang's record of its attempt."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from shardyard.events import (
    FailureCause,
    JobCancelRequested,
    JobPreempting,
    JobUnschedulable,
    MissingArtifact,
    PendingReason,
    RunningShard,
    ShardFailed,
)
from shardyard.placement.model import PendingJob, Unschedulable
from shardyard.scheduler.cancellation import CancelRequests
from shardyard.scheduler.fencing import Fence
from shardyard.scheduler.gang import Gang
from shardyard.scheduler.orphans import OrphanCheck, running_keys
from shardyard.scheduler.reasons import ESTIMATE_EVERY_S, PendingReasons
from tests.unit.builders import at, completed, failed, job_spec, node_state, scheduled, started

# --- the fence's record --------------------------------------------------------------------------------------------


def test_the_fence_takes_a_new_placement_and_numbers_the_next_attempt_above_every_one_seen() -> None:
    fence = Fence()
    first = scheduled(term=7, attempt=1)

    assert (fence.attempt("job-1"), fence.next_attempt("job-1")) == (0, 1)
    assert fence.take(first, None, ended=False)
    assert not fence.take(first, first, ended=False)  # its echo
    assert not fence.take(scheduled(term=5, attempt=4), first, ended=False)  # a deposed leader's, numbered higher

    assert fence.placed == {"job-1": (7, 1)}
    assert (fence.attempt("job-1"), fence.next_attempt("job-1")) == (1, 5)
    assert [(s.term, s.attempt) for s in fence.take_stale()] == [(5, 4)]
    assert fence.take_stale() == []


def test_a_newer_leaders_placement_supersedes_the_one_in_force_which_is_kept_to_revoke() -> None:
    fence = Fence()
    mine = scheduled(term=5, attempt=2)
    fence.take(mine, None, ended=False)

    assert fence.take(scheduled(term=7, attempt=1), mine, ended=False)
    assert fence.placed == {"job-1": (7, 1)}
    assert fence.stale == [mine]
    assert fence.next_attempt("job-1") == 3


def test_a_placement_of_an_ended_job_is_only_numbered() -> None:
    fence = Fence()

    assert not fence.take(scheduled(term=7, attempt=2), None, ended=True)
    assert (fence.placed, fence.stale, fence.next_attempt("job-1")) == ({}, [], 3)


# --- cancel requests -----------------------------------------------------------------------------------------------


def request(job_id: str, by: str = "cli") -> JobCancelRequested:
    return JobCancelRequested(occurred_at=at(1), job_id=job_id, requested_by=by)


def test_cancel_requests_are_due_once_their_job_is_held_until_it_ends() -> None:
    cancels = CancelRequests()
    cancels.note(request("a", "alice"))
    cancels.note(request("b", "bob"))

    assert cancels.due(["c"], at(5)) == []  # not held here yet
    due = cancels.due(["c", "b", "a"], at(5))
    assert [(r.job_id, r.requested_by, r.occurred_at) for r in due] == [("b", "bob", at(5)), ("a", "alice", at(5))]

    cancels.forget("b")
    assert [r.job_id for r in cancels.due(["a", "b"], at(6))] == ["a"]


# --- reasons shown for pending jobs --------------------------------------------------------------------------------


def verdict(reason: PendingReason = PendingReason.NO_FIT, message: str = "0/3") -> Unschedulable:
    return Unschedulable("job-1", reason, message, {"NO_FIT": 3})


def test_a_pending_reason_is_shown_when_it_changes_and_again_once_forgotten() -> None:
    reasons = PendingReasons()
    job = PendingJob(job_spec(), at(0))

    (shown,) = reasons.unschedulable(verdict(), job, at(1))
    again = reasons.unschedulable(verdict(), job, at(2))
    changed = reasons.unschedulable(verdict(PendingReason.INSUFFICIENT_GPUS, "1/3"), job, at(3))
    reasons.forget("job-1")
    after_placed = reasons.unschedulable(verdict(PendingReason.INSUFFICIENT_GPUS, "1/3"), job, at(4))

    assert isinstance(shown, JobUnschedulable)
    assert (shown.reason, shown.message, dict(shown.node_counts)) == (PendingReason.NO_FIT, "0/3", {"NO_FIT": 3})
    assert again == []
    assert [e.reason for e in changed if isinstance(e, JobUnschedulable)] == [PendingReason.INSUFFICIENT_GPUS]
    assert len(after_placed) == 1


def test_a_job_waiting_for_artifacts_is_shown_with_them_and_again_when_other_nodes_lack_them() -> None:
    reasons = PendingReasons()
    job = PendingJob(job_spec(), at(0))
    lacking = MissingArtifact(path="/data/datasets/wikitext", nodes=("a1", "a2"), lacking=2, of_nodes=2)

    def wait(message: str, missing: MissingArtifact) -> list[object]:
        decision = replace(verdict(PendingReason.WAITING_FOR_ARTIFACT, message), missing=(missing,))
        return list(reasons.unschedulable(decision, job, at(1)))

    (shown,) = wait("0/2; /data/datasets/wikitext absent on every node it could use (a1, a2)", lacking)
    assert isinstance(shown, JobUnschedulable) and shown.missing_artifacts == (lacking,)
    assert wait("0/2; /data/datasets/wikitext absent on every node it could use (a1, a2)", lacking) == []
    fewer = lacking.model_copy(update={"nodes": ("a2",), "lacking": 1})
    (again,) = wait("0/2; /data/datasets/wikitext absent on 1 of the 2 nodes it could use (a2)", fewer)
    assert isinstance(again, JobUnschedulable) and again.missing_artifacts == (fewer,)


def test_an_estimated_start_is_shown_again_only_when_it_moved_by_a_tenth_of_the_wait() -> None:
    reasons = PendingReasons()
    job = PendingJob(job_spec(), at(0))

    def estimate(start_s: float | None, now_s: float) -> list[object]:
        decision = replace(
            verdict(PendingReason.INSUFFICIENT_GPUS), estimated_start=None if start_s is None else at(start_s)
        )
        return list(reasons.unschedulable(decision, job, at(now_s)))

    first = estimate(1000.0, 0.0)  # 1,000 s out: moves of up to 100 s are the same estimate
    assert len(first) == 1
    assert estimate(1090.0, 1.0) == []
    (moved,) = estimate(1200.0, 2.0)
    assert isinstance(moved, JobUnschedulable) and moved.estimated_start == at(1200.0)
    assert estimate(1200.5, 1199.0) == []  # a second out: a second's move is the same
    assert len(estimate(1203.0, 1199.5)) == 1
    assert len(estimate(None, 1200.0)) == 1  # no longer known is news
    assert estimate(None, 1201.0) == []


def test_the_p90_start_is_shown_beside_the_p50_and_its_own_move_shows_both_again() -> None:
    reasons = PendingReasons()
    job = PendingJob(job_spec(), at(0))

    def estimate(p50_s: float, p90_s: float | None, now_s: float) -> list[object]:
        p90 = None if p90_s is None else at(p90_s)
        decision = replace(verdict(PendingReason.INSUFFICIENT_GPUS), estimated_start=at(p50_s), estimated_start_p90=p90)
        return list(reasons.unschedulable(decision, job, at(now_s)))

    (first,) = estimate(1000.0, 2000.0, 0.0)
    assert isinstance(first, JobUnschedulable)
    assert (first.estimated_start, first.estimated_start_p90) == (at(1000.0), at(2000.0))
    assert estimate(1050.0, 2150.0, 1.0) == []  # each within a tenth of its own wait (100 s, 200 s)
    (moved,) = estimate(1050.0, 2300.0, 2.0)  # the p90 alone moved by 300 s: the p50's 50 s goes with it
    assert isinstance(moved, JobUnschedulable)
    assert (moved.estimated_start, moved.estimated_start_p90) == (at(1050.0), at(2300.0))
    assert len(estimate(1050.0, None, 3.0)) == 1  # the p90 no longer known is news
    assert estimate(1050.0, None, 4.0) == []


def test_the_blocked_verdicts_are_the_last_cycles_only() -> None:
    reasons = PendingReasons()
    job = PendingJob(job_spec(), at(0))
    reasons.unschedulable(verdict(), job, at(1))
    reasons.unschedulable(verdict(), job, at(2))  # shown already: still blocked this cycle

    assert reasons.blocked == [(job.spec, PendingReason.NO_FIT, at(0))] * 2
    reasons.new_cycle()
    assert reasons.blocked == []


# --- the orphan check's pace ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("second_after_s", "checked_again"),
    [pytest.param(0.5, False, id="within-its-pace"), pytest.param(1.0, True, id="at-its-pace")],
)
def test_the_orphan_check_looks_at_most_once_a_pace(second_after_s: float, checked_again: bool) -> None:
    check = OrphanCheck(every_s=1.0)
    gang = Gang(job_spec(), scheduled())  # two training shards on node-a, which reports none running
    node = node_state("node-a")
    nodes, running = {"node-a": node}, {"node-a": running_keys(node)}

    def run(when: float) -> list[object]:
        return list(check.run([gang], nodes, running, at(when), deadline_s=0, grace_s=0, term=3))

    assert run(10) == []  # the first look starts the grace
    assert (len(run(10 + second_after_s)) > 0) is checked_again


def test_a_shard_listed_running_again_is_not_an_orphan() -> None:
    check = OrphanCheck(every_s=0)
    gang = Gang(job_spec(), scheduled())
    silent = node_state("node-a")
    listed = node_state("node-a", running=(RunningShard(job_id="job-1", shard_index=0, attempt=1, pid=1),))

    for when, state in ((10, silent), (20, listed)):
        found = check.run(
            [gang], {"node-a": state}, {"node-a": running_keys(state)}, at(when), deadline_s=0, grace_s=5, term=3
        )

    failures = [e for e in found if isinstance(e, ShardFailed)]
    assert [(f.shard_index, f.cause) for f in failures] == [(1, FailureCause.ORPHANED)]


# --- a gang's record of its attempt --------------------------------------------------------------------------------


def test_a_gang_records_the_facts_of_its_attempt() -> None:
    gang = Gang(job_spec(), scheduled())

    gang.record(started(shard_index=0))
    gang.record(failed(shard_index=1))
    gang.record(started(shard_index=1))  # after its failure (its start deadline): too late
    gang.record(completed(shard_index=0))
    gang.record(JobPreempting(occurred_at=at(3), job_id="job-1", attempt=1, by_job="vip", deadline_s=30))

    assert (gang.started, gang.failed, set(gang.completed)) == ({0}, {1}, {0})
    assert (gang.preempted_by, gang.preempt_deadline) == ("vip", at(3) + timedelta(seconds=30))


def test_start_estimates_are_made_for_a_new_job_and_every_ten_seconds_and_kept_in_between() -> None:
    """The interval plan is dear: a cycle makes estimates when a job waits that has none, else every
    ``ESTIMATE_EVERY_S``; the cycles between keep what each job was shown with, whatever their verdicts carry."""
    reasons = PendingReasons()
    job = PendingJob(job_spec(), at(0))

    def cycle(now_s: float, p50_s: float | None, pending: tuple[str, ...] = ("job-1",)) -> list[object]:
        estimating = reasons.estimating(pending, at(now_s))
        decision = replace(
            verdict(PendingReason.INSUFFICIENT_GPUS),
            estimated_start=at(p50_s) if estimating and p50_s is not None else None,
        )
        return list(reasons.unschedulable(decision, job, at(now_s)))

    (first,) = cycle(0.0, 1000.0)  # a new job: estimated
    assert isinstance(first, JobUnschedulable) and first.estimated_start == at(1000.0)
    assert cycle(1.0, None) == []  # no estimates this cycle: the shown one stands, nothing is news
    assert not reasons.estimating(("job-1",), at(2.0))
    assert reasons.estimating(("job-1", "job-2"), at(3.0))  # a job without an estimate waits
    (moved,) = cycle(ESTIMATE_EVERY_S + 3.0, 1500.0)
    assert isinstance(moved, JobUnschedulable) and moved.estimated_start == at(1500.0)
