"""The start deadline: a shard not reported started within ``start_deadline_s`` of its placement is revoked and
reported failed START_TIMEOUT, once, and never a shard that started, a spare, or a gang being preempted or cancelled."""

from __future__ import annotations

from datetime import timedelta

import pytest

from shardyard.events import (
    Event,
    FailureCause,
    JobCancelled,
    JobCancelRequested,
    JobPreempting,
    JobReady,
    JobRecovering,
    JobRunning,
    JobScheduled,
    ShardFailed,
    ShardRevocation,
)
from shardyard.scheduler.book import SchedulerBook
from tests.unit.builders import at, completed, failed, gpus, job_spec, node_state, redundancy, started

DEADLINE_S = 60.0
PLACED_AT = 1.0
DUE = PLACED_AT + DEADLINE_S


def of(events: list[Event], kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind)]


def timed_out(events: list[Event]) -> list[tuple[int, str]]:
    """(shard, node) of each START_TIMEOUT failure, checked against its revocation."""
    failures = [e for e in of(events, ShardFailed) if e.cause is FailureCause.START_TIMEOUT]
    revoked = [(r.shard_index, r.node_id, r.attempt) for r in of(events, ShardRevocation)]
    assert revoked == [(f.shard_index, f.node_id, f.attempt) for f in failures], "each failure has its revocation"
    return [(f.shard_index, f.node_id) for f in failures]


def cluster(*nodes: str, ratio: float = 0.0) -> SchedulerBook:
    book = SchedulerBook(term=3, start_deadline_s=DEADLINE_S)
    if ratio:
        book.apply(redundancy(ratio))
    for node_id in nodes:
        book.apply(node_state(node_id, gpus=gpus(count=1)))
    return book


def place(book: SchedulerBook, when: float = PLACED_AT) -> JobScheduled:
    book.apply(JobReady(occurred_at=at(0), job_id="job-1", spec=job_spec(memory_bytes=0, cpu_cores=1.0)))
    (scheduled,) = of(book.cycle(at(when)), JobScheduled)
    return scheduled


def node_of(scheduled: JobScheduled, shard: int) -> str:
    return next(p.node_id for p in scheduled.placements if p.shard_index == shard)


PREEMPTING = JobPreempting(occurred_at=at(30), job_id="job-1", attempt=1, by_job="vip", deadline_s=600)


@pytest.mark.parametrize(
    ("facts", "now", "overdue"),
    [
        pytest.param([], DUE - 0.5, [], id="before-the-deadline"),
        pytest.param([], DUE, [0, 1], id="none-started-at-the-deadline"),
        pytest.param([started(shard_index=0)], DUE, [1], id="one-started"),
        pytest.param([started(shard_index=0), started(shard_index=1)], DUE, [], id="all-started"),
        pytest.param([JobRunning(occurred_at=at(2), job_id="job-1", attempt=1)], DUE, [], id="a-running-gang"),
        pytest.param([started(shard_index=0, attempt=2)], DUE, [0, 1], id="a-start-of-another-attempt-is-not-one"),
        pytest.param([started("job-2", 0)], DUE, [0, 1], id="a-start-of-another-job-is-not-one"),
        pytest.param(
            [failed(shard_index=0, cause=FailureCause.LAUNCH_ERROR)], DUE, [1], id="a-failed-shard-is-not-overdue"
        ),
        pytest.param([completed(shard_index=1)], DUE, [0], id="a-completed-shard-is-not-overdue"),
        pytest.param([PREEMPTING], DUE, [], id="a-gang-being-preempted-is-left-to-its-preemption"),
        pytest.param([JobCancelled(occurred_at=at(30), job_id="job-1", message="x")], DUE, [], id="cancelled"),
    ],
)
def test_which_shards_are_overdue(facts: list[object], now: float, overdue: list[int]) -> None:
    book = cluster("n1", "n2")
    scheduled = place(book)
    for fact in facts:
        book.apply(fact)

    events = book.cycle(at(now))

    assert timed_out(events) == [(shard, node_of(scheduled, shard)) for shard in overdue]


def test_an_overdue_shard_is_revoked_and_failed_start_timeout_under_the_leaders_term() -> None:
    book = cluster("n1", "n2")
    scheduled = place(book)
    book.apply(started(shard_index=0))

    revocation, failure = book.cycle(at(DUE + 5))

    node = node_of(scheduled, 1)
    assert isinstance(revocation, ShardRevocation) and isinstance(failure, ShardFailed)
    assert (revocation.job_id, revocation.shard_index, revocation.node_id) == ("job-1", 1, node)
    assert (revocation.attempt, revocation.term) == (1, 3)
    assert "start deadline" in revocation.message
    assert (failure.job_id, failure.shard_index, failure.node_id, failure.attempt) == ("job-1", 1, node, 1)
    assert (failure.cause, failure.exit_code, failure.occurred_at) == (FailureCause.START_TIMEOUT, None, at(DUE + 5))
    assert "60s" in failure.message


def test_an_overdue_shard_is_decided_once_whatever_comes_back() -> None:
    book = cluster("n1", "n2")
    place(book)
    first = book.cycle(at(DUE))
    assert len(timed_out(first)) == 2

    again = book.cycle(at(DUE + 1))
    for echo in first:  # our own publications, back from the log
        book.apply(echo)
    after_echo = book.cycle(at(DUE + 2))

    assert again == [] and after_echo == []


def test_a_new_leader_rebuilt_from_the_log_does_not_fail_the_shard_again() -> None:
    old = cluster("n1", "n2")
    scheduled = place(old)
    log: list[object] = [
        *(node_state(n, gpus=gpus(count=1)) for n in ("n1", "n2")),
        JobReady(occurred_at=at(0), job_id="job-1", spec=job_spec(memory_bytes=0, cpu_cores=1.0)),
        scheduled,
        started(shard_index=0),
        *old.cycle(at(DUE)),
    ]

    new = SchedulerBook(term=4, start_deadline_s=DEADLINE_S)
    for fact in log:
        new.apply(fact)

    assert new.cycle(at(DUE + 30)) == []


def test_a_start_reported_after_the_shards_failure_does_not_make_the_gang_running() -> None:
    book = cluster("n1", "n2")
    place(book)
    book.apply(started(shard_index=0))
    book.cycle(at(DUE))

    book.apply(started(shard_index=1, occurred_at=at(DUE + 1)))  # the agent woke up: its shard is revoked already

    assert of(book.on_shard_event(at(DUE + 1)), JobRunning) == []
    assert book.cycle(at(DUE + 2)) == []


def test_spares_start_nothing_and_are_never_overdue() -> None:
    book = cluster("n1", "n2", "n3", ratio=0.5)
    scheduled = place(book, when=3.0)  # past the spare grace
    assert [p.spare for p in scheduled.placements] == [False, False, True]
    for shard in (0, 1):
        book.apply(started(shard_index=shard))

    assert book.cycle(at(3.0 + DEADLINE_S)) == []


def test_a_gang_being_cancelled_is_revoked_for_the_cancel_not_failed() -> None:
    book = cluster("n1", "n2")
    place(book)
    book.apply(JobCancelRequested(occurred_at=at(30), job_id="job-1"))  # taken in by a standby, say

    events = book.cycle(at(DUE))

    assert of(events, ShardFailed) == []
    assert len(of(events, JobCancelled)) == 1
    assert all("cancelled" in r.message for r in of(events, ShardRevocation))


def test_the_recovered_gang_leaves_the_node_and_gets_a_deadline_of_its_own() -> None:
    book = cluster("n1", "n2", "n3")
    first = place(book)
    book.apply(started(shard_index=0))
    (failure,) = of(book.cycle(at(DUE)), ShardFailed)
    plan = JobRecovering(  # what the fault manager makes of it: START_TIMEOUT excludes the node
        occurred_at=at(DUE + 1),
        job_id="job-1",
        attempt=1,
        cause=FailureCause.START_TIMEOUT,
        message="attempt 1 failed",
        exclude_nodes=(failure.node_id,),
        retry_at=at(DUE + 1),
        retries_used=1,
        retries_left=2,
    )

    (second,) = of(book.on_recovering(plan, at(DUE + 1)), JobScheduled)

    assert second.attempt == 2
    assert [p.node_id for p in second.placements] == [node_of(first, 0), "n3"]
    recovered_due = DUE + 1 + DEADLINE_S
    assert book.cycle(at(recovered_due) - timedelta(seconds=1)) == []
    book.apply(started(shard_index=0, attempt=2))
    assert timed_out(book.cycle(at(recovered_due))) == [(1, "n3")]
