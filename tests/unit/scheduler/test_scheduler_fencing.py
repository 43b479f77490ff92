"""Placements are fenced by leader term, job by job: a deposed leader's placement that lands after its successor's
changes nothing and is revoked; a newer leader's supersedes the job's current one; every reader, the leader and a
standby reading in log order, ends with the same gang; a new placement never reuses an attempt number seen placed;
a book never decides under a term it read."""

from __future__ import annotations

from typing import Any

import pytest

from shardyard.events import (
    Event,
    FailureCause,
    JobReady,
    JobRecovering,
    JobScheduled,
    ShardRevocation,
)
from shardyard.fault_manager.book import FaultBook
from shardyard.scheduler.book import SchedulerBook
from shardyard.scheduler.fencing import Verdict, judge
from tests.unit.builders import at, failed, gpus, job_spec, node_state, scheduled

NODES = ("n1", "n2", "n3", "n4")


def of(events: list[Event], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def placement(term: int, attempt: int = 1, nodes: tuple[str, ...] = ("n1", "n2")) -> JobScheduled:
    return scheduled("job-1", *nodes, term=term, attempt=attempt, occurred_at=at(term))


def book(term: int = 7) -> SchedulerBook:
    new = SchedulerBook(term=term)
    for node_id in NODES:
        new.apply(node_state(node_id, gpus=gpus(count=1)))
    new.apply(JobReady(occurred_at=at(0), job_id="job-1", spec=job_spec(memory_bytes=0, cpu_cores=1.0)))
    return new


def gang_of(book: SchedulerBook) -> tuple[int, int, tuple[str, ...]]:
    current = book.gangs["job-1"].scheduled
    return current.term, current.attempt, tuple(p.node_id for p in current.placements)


def revoked(events: list[Event]) -> list[tuple[str, int, int, int]]:
    return sorted((r.node_id, r.shard_index, r.attempt, r.term) for r in of(events, ShardRevocation))


@pytest.mark.parametrize(
    ("term", "attempt", "newest", "current", "verdict"),
    [
        pytest.param(5, 1, None, False, Verdict.NEW, id="the-first-placement"),
        pytest.param(5, 1, (7, 1), True, Verdict.STALE, id="a-deposed-leaders-placement-landing-late"),
        pytest.param(5, 3, (7, 1), True, Verdict.STALE, id="a-deposed-leaders-even-with-a-higher-attempt"),
        pytest.param(7, 1, (5, 1), True, Verdict.NEW, id="a-newer-leaders-placement-of-the-same-attempt"),
        pytest.param(7, 1, (5, 2), True, Verdict.NEW, id="a-newer-leaders-whatever-its-attempt"),
        pytest.param(7, 1, (7, 2), False, Verdict.STALE, id="an-older-attempt-of-the-same-leader"),
        pytest.param(7, 2, (7, 2), True, Verdict.ECHO, id="the-current-placement-again"),
        pytest.param(7, 2, (7, 2), False, Verdict.ENDED, id="the-newest-attempt-after-it-ended"),
        pytest.param(7, 3, (7, 2), False, Verdict.NEW, id="the-next-attempt"),
    ],
)
def test_the_verdict_on_a_placement(
    term: int, attempt: int, newest: tuple[int, int] | None, current: bool, verdict: Verdict
) -> None:
    in_force = scheduled(term=newest[0], attempt=newest[1]) if current and newest else None

    assert judge(scheduled(term=term, attempt=attempt), newest, in_force) is verdict


def test_a_deposed_leaders_placement_landing_after_the_new_leaders_changes_nothing_and_is_revoked() -> None:
    leader = book(term=7)
    (mine,) = of(leader.cycle(at(8)), JobScheduled)
    assert (mine.term, mine.attempt) == (7, 1)

    leader.apply(placement(term=5, nodes=("n3", "n4")))  # decided by term 5 before it was deposed; landed now

    assert gang_of(leader) == (7, 1, tuple(p.node_id for p in mine.placements))
    events = leader.cycle(at(9))
    assert of(events, JobScheduled) == []
    assert revoked(events) == [("n3", 0, 1, 7), ("n4", 1, 1, 7)]  # under the leader's term: agents accept it
    assert leader.cycle(at(10)) == []  # revoked once


def test_the_leader_and_a_standby_reading_in_log_order_end_with_the_same_gang() -> None:
    """The leader applied its own placement (term 7) before reading the deposed leader's (term 5), which the log
    holds first: the standby reads them in log order. The higher term wins for both."""
    deposed, newer = placement(term=5, nodes=("n3", "n4")), placement(term=7, nodes=("n1", "n2"))
    leader, standby = book(term=7), book(term=1)

    for event in (newer, deposed, newer):  # its decision, then the log: the late record, its own echo
        leader.apply(event)
    for event in (deposed, newer):
        standby.apply(event)

    assert gang_of(leader) == gang_of(standby) == (7, 1, ("n1", "n2"))
    standby.term = 9  # the standby takes over later: it revokes what the deposed placement assigned
    assert revoked(standby.cycle(at(20))) == [("n3", 0, 1, 9), ("n4", 1, 1, 9)]


def test_a_shard_both_placements_put_on_one_node_under_one_key_is_not_revoked() -> None:
    leader = book(term=7)
    leader.apply(placement(term=7, nodes=("n1", "n2")))

    leader.apply(placement(term=5, nodes=("n1", "n3")))  # shard 0 on n1 in both: one process on n1, the current

    assert revoked(leader.cycle(at(9))) == [("n3", 1, 1, 7)]


def test_a_new_placement_never_reuses_an_attempt_number_seen_placed() -> None:
    leader = book(term=7)
    leader.apply(placement(term=7, attempt=1, nodes=("n1", "n2")))
    leader.apply(placement(term=5, attempt=2, nodes=("n3", "n4")))  # fenced: yet attempt 2 is taken
    plan = JobRecovering(
        occurred_at=at(30),
        job_id="job-1",
        attempt=1,
        cause=FailureCause.PROCESS_EXIT,
        message="exit 1",
        retry_at=at(30),
        retries_used=1,
        retries_left=2,
    )

    (second,) = of(leader.on_recovering(plan, at(30)), JobScheduled)

    assert (second.term, second.attempt) == (7, 3)


def test_a_book_never_decides_under_a_term_it_read() -> None:
    deposed = book(term=5)
    deposed.apply(placement(term=9, nodes=("n1", "n2")))  # its successor's placement
    deposed.apply(JobReady(occurred_at=at(1), job_id="job-2", spec=job_spec(job_id="job-2", memory_bytes=0)))

    (second,) = of(deposed.cycle(at(12)), JobScheduled)

    assert deposed.term == 5 and second.term == 5  # agents and the pool refuse it: term 9 was seen


def test_the_fault_manager_fences_placements_by_term_too() -> None:
    faults = FaultBook()
    faults.apply(placement(term=7, nodes=("n1", "n2")))

    faults.apply(placement(term=5, nodes=("n3", "n4")))  # landing late
    gang = faults.jobs["job-1"].gang
    assert gang is not None and (gang.term, set(gang.shards.values())) == (7, {"n1", "n2"})

    faults.apply(placement(term=9, nodes=("n3", "n4")))  # a newer leader's, same attempt: a fresh gang, not merged
    gang = faults.jobs["job-1"].gang
    assert gang is not None and (gang.term, gang.shards) == (9, {0: "n3", 1: "n4"})
    faults.apply(failed(shard_index=0, node_id="n3", cause=FailureCause.PROCESS_EXIT))
    (plan,) = faults.decide(at(30))
    assert isinstance(plan, JobRecovering) and plan.attempt == 1
