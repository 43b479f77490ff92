"""Orphaned shards: past its start deadline, a shard its node's state has left out of the running shards for longer
than the reservation grace is revoked and failed ORPHANED, once; never a shard the node lists, a spare, an ended
shard, a shard of a gang being preempted, or one on a node that is not ALIVE. A job whose data breaks the cycle
fails alone, INVALID_SPEC, and the others are placed."""

from __future__ import annotations

from typing import Any

import pytest

from shardyard.events import (
    Event,
    FailureCause,
    JobFailed,
    JobPreempting,
    JobReady,
    JobScheduled,
    NodeStatus,
    RunningShard,
    ShardFailed,
    ShardRevocation,
)
from shardyard.scheduler.book import SchedulerBook
from tests.unit.builders import at, completed, gpus, job_spec, node_state, redundancy, started

DEADLINE_S = 60.0
GRACE_S = 30.0
PLACED_AT = 3.0
DUE = PLACED_AT + DEADLINE_S
"""The first cycle past the start deadline: where the grace of a shard missing from the start begins."""


def of(events: list[Event], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def orphans(events: list[Event]) -> list[tuple[int, str]]:
    """(shard, node) of each ORPHANED failure, checked against its revocation."""
    failures = [e for e in of(events, ShardFailed) if e.cause is FailureCause.ORPHANED]
    revoked = [(r.shard_index, r.node_id, r.attempt) for r in of(events, ShardRevocation)]
    assert revoked == [(f.shard_index, f.node_id, f.attempt) for f in failures], "each failure has its revocation"
    return [(f.shard_index, f.node_id) for f in failures]


def cluster(ratio: float = 0.0) -> SchedulerBook:
    book = SchedulerBook(term=3, start_deadline_s=DEADLINE_S, reservation_grace_s=GRACE_S)
    if ratio:
        book.apply(redundancy(ratio))
    for node_id in ("n1", "n2", "n3"):
        book.apply(node_state(node_id, gpus=gpus(count=1)))
    return book


def running(book: SchedulerBook) -> JobScheduled:
    """job-1 placed (past the spare grace) and both its shards reported started: the start deadline is met."""
    book.apply(JobReady(occurred_at=at(0), job_id="job-1", spec=job_spec(memory_bytes=0, cpu_cores=1.0)))
    (scheduled,) = of(book.cycle(at(PLACED_AT)), JobScheduled)
    for shard in (0, 1):
        book.apply(started(shard_index=shard, node_id=node_of(scheduled, shard)))
    book.on_shard_event(at(PLACED_AT + 1))
    return scheduled


def node_of(scheduled: JobScheduled, shard: int) -> str:
    return next(p.node_id for p in scheduled.placements if p.shard_index == shard)


def lists(book: SchedulerBook, node_id: str, *shards: int, when: float) -> None:
    """``node_id``'s state: its agent runs these shards of job-1's attempt 1."""
    shown = tuple(RunningShard(job_id="job-1", shard_index=s, attempt=1) for s in shards)
    book.apply(node_state(node_id, gpus=gpus(count=1), running=shown, occurred_at=at(when)))


@pytest.mark.parametrize(
    ("after_s", "expected"),
    [
        pytest.param(GRACE_S, [], id="at-the-grace-kept"),
        pytest.param(GRACE_S + 1, [0, 1], id="one-second-past-the-grace-revoked"),
    ],
)
def test_a_shard_no_node_reports_running_is_orphaned_past_the_grace(after_s: float, expected: list[int]) -> None:
    book = cluster()
    scheduled = running(book)
    assert book.cycle(at(DUE - 1)) == []  # within the start deadline nothing is judged
    assert book.cycle(at(DUE)) == []  # the first check that finds them missing: the grace starts

    events = book.cycle(at(DUE + after_s))

    assert orphans(events) == [(shard, node_of(scheduled, shard)) for shard in expected]
    assert all(r.term == 3 and "orphaned" in r.message for r in of(events, ShardRevocation))
    assert all("grace 30s" in f.message for f in of(events, ShardFailed))


def test_an_orphaned_shard_is_failed_once_whatever_comes_back() -> None:
    book = cluster()
    running(book)
    book.cycle(at(DUE))
    first = book.cycle(at(DUE + GRACE_S + 1))
    assert len(orphans(first)) == 2

    for echo in first:
        book.apply(echo)

    assert book.cycle(at(DUE + GRACE_S + 2)) == []


def test_a_node_that_lists_the_shard_again_resets_its_grace() -> None:
    book = cluster()
    scheduled = running(book)
    one, two = node_of(scheduled, 0), node_of(scheduled, 1)
    lists(book, one, 0, when=DUE - 5)
    lists(book, two, 1, when=DUE - 5)
    assert book.cycle(at(DUE)) == []  # both listed: nothing counts

    lists(book, one, when=DUE + 10)  # shard 0 vanished from its node's running shards
    book.cycle(at(DUE + 10))
    lists(book, one, 0, when=DUE + 20)  # a heartbeat on its way: listed again
    book.cycle(at(DUE + 20))
    lists(book, one, when=DUE + 25)
    book.cycle(at(DUE + 25))

    assert book.cycle(at(DUE + 25 + GRACE_S)) == []  # the grace restarted at DUE + 25
    assert orphans(book.cycle(at(DUE + 26 + GRACE_S))) == [(0, one)]


def test_spares_ended_shards_and_preempted_gangs_are_never_orphaned() -> None:
    book = cluster(ratio=0.5)
    scheduled = running(book)
    assert [p.spare for p in scheduled.placements] == [False, False, True]
    book.apply(completed(shard_index=1, node_id=node_of(scheduled, 1)))
    book.cycle(at(DUE))
    assert orphans(book.cycle(at(DUE + GRACE_S + 1))) == [(0, node_of(scheduled, 0))]  # not 1, nor the spare

    preempted = cluster()
    running(preempted)
    preempted.apply(JobPreempting(occurred_at=at(DUE), job_id="job-1", attempt=1, by_job="vip", deadline_s=600))
    preempted.cycle(at(DUE))
    assert orphans(preempted.cycle(at(DUE + GRACE_S + 1))) == []


def test_a_shard_on_a_node_that_is_not_alive_is_left_to_node_loss() -> None:
    book = cluster()
    scheduled = running(book)
    suspect = node_of(scheduled, 1)
    book.apply(node_state(suspect, gpus=gpus(count=1), status=NodeStatus.SUSPECT))
    book.cycle(at(DUE))

    assert orphans(book.cycle(at(DUE + GRACE_S + 1))) == [(0, node_of(scheduled, 0))]


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"shard_count": 0, "gpu_count": 0}, id="no-shards"),
        pytest.param({"priority": 10**400}, id="a-priority-no-float-holds"),
    ],
)
def test_a_job_whose_data_breaks_the_cycle_fails_alone_and_the_others_are_placed(bad: dict[str, object]) -> None:
    """A ready job no admission would let through (produced straight to the lifecycle topic, say)."""
    book = cluster()
    broken = job_spec(**{"job_id": "bad", "memory_bytes": 0, "cpu_cores": 1.0, **bad})
    book.apply(JobReady(occurred_at=at(0), job_id="bad", spec=broken))
    book.apply(JobReady(occurred_at=at(0), job_id="good", spec=job_spec(job_id="good", memory_bytes=0)))

    events = book.cycle(at(PLACED_AT))

    (failure,) = of(events, JobFailed)
    assert (failure.job_id, failure.cause) == ("bad", FailureCause.INVALID_SPEC)
    assert "cannot place" in failure.message or "Error" in failure.message
    assert [e.job_id for e in of(events, JobScheduled)] == ["good"]
    assert of(book.cycle(at(PLACED_AT + 1)), JobFailed) == []  # failed once
