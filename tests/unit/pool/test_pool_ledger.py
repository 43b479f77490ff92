"""The reservations ledger lets GPUs go: an orphaned reservation (past the start deadline, left out of its node's
full heartbeats for longer than the grace) is released, a listing resets its grace, spares and nodes that are not
ALIVE keep theirs; placements are fenced by term job by job; a recovery plan ends its attempt's reservations."""

from __future__ import annotations

import pytest

from shardyard.events import FailureCause, JobRecovering, NodeState, RunningShard
from shardyard.resource_pool.book import PoolBook
from shardyard.resource_pool.ledger import Ledger
from tests.unit.builders import assignment, at, gpus, heartbeat, scheduled

DEADLINE_S = 60.0
GRACE_S = 30.0


def pool(suspect_after_s: float = 600.0) -> PoolBook:
    """node-a's pool; a silent node turns SUSPECT after ``suspect_after_s`` (not within these tests by default), and
    is never LOST within them."""
    ledger = Ledger(start_deadline_s=DEADLINE_S, grace_s=GRACE_S)
    book = PoolBook(suspect_after_s=suspect_after_s, lost_after_s=1000.0, ledger=ledger)
    book.on_heartbeat(heartbeat("node-a", gpus=gpus(count=4)), at(0))
    return book


def beat(book: PoolBook, when: float, *running: tuple[int, int]) -> None:
    """A full heartbeat of node-a at ``when`` listing these (shard, attempt) of job-1 running."""
    shown = tuple(RunningShard(job_id="job-1", shard_index=s, attempt=a) for s, a in running)
    book.on_heartbeat(heartbeat("node-a", gpus=gpus(count=4), seq=int(when), running=shown), at(when))


def allocated(book: PoolBook, when: float) -> tuple[int, ...]:
    return book.state_of("node-a", at(when)).allocated_gpus


def keep_alive(book: PoolBook, until: float, *running: tuple[int, int], every: float = 5.0) -> None:
    when = every
    while when <= until:
        beat(book, when, *running)
        when += every


@pytest.mark.parametrize(
    ("at_s", "left"),
    [
        pytest.param(DEADLINE_S + GRACE_S, (0,), id="at-the-grace-kept"),
        pytest.param(DEADLINE_S + GRACE_S + 1, (), id="one-second-past-the-grace-released"),
    ],
)
def test_a_reservation_no_heartbeat_lists_is_released_past_the_start_deadline_and_the_grace(
    at_s: float, left: tuple[int, ...]
) -> None:
    book = pool()
    book.on_ledger_event(assignment(shard_index=0, gpu_indices=(0,), occurred_at=at(0)))
    keep_alive(book, at_s)  # every heartbeat leaves it out: the agent never ran it

    events = book.tick(at(at_s))

    assert allocated(book, at_s) == left
    if not left:
        (state,) = events  # the node's fresh state goes out at once
        assert isinstance(state, NodeState) and state.allocated_gpus == ()


def test_the_grace_counts_from_the_first_heartbeat_that_left_it_out_and_a_listing_resets_it() -> None:
    book = pool()
    book.on_ledger_event(assignment(shard_index=0, gpu_indices=(0,), occurred_at=at(0)))
    keep_alive(book, 100.0, (0, 1))  # running: listed every heartbeat
    beat(book, 101.0)  # then left out (the process vanished, no end reported)
    beat(book, 110.0, (0, 1))  # listed again: a heartbeat reordered, say
    beat(book, 120.0)

    book.tick(at(150.0))
    assert allocated(book, 150.0) == (0,)  # 30 s since 120: not longer than the grace
    book.tick(at(151.0))
    assert allocated(book, 151.0) == ()


def test_spares_and_reservations_on_a_node_not_alive_are_not_orphaned() -> None:
    book = pool()
    book.on_ledger_event(assignment(shard_index=2, gpu_indices=(2,), spare=True, occurred_at=at(0)))
    keep_alive(book, 200.0)
    book.tick(at(200.0))
    assert allocated(book, 200.0) == (2,)  # a spare runs nothing until promoted

    silent = pool(suspect_after_s=3.0)
    silent.on_ledger_event(assignment(shard_index=0, gpu_indices=(0,), occurred_at=at(0)))
    beat(silent, 1.0)  # left out, then silence: SUSPECT 3 s later; node loss, not orphanhood, decides
    silent.tick(at(4.0))
    silent.tick(at(DEADLINE_S + GRACE_S + 1))
    assert allocated(silent, DEADLINE_S + GRACE_S + 1) == (0,)


def test_a_deposed_leaders_assignment_landing_after_the_newer_placement_reserves_nothing() -> None:
    ledger = Ledger()
    ledger.apply(scheduled(term=7))
    ledger.apply(assignment(shard_index=0, gpu_indices=(0,), term=7))

    assert ledger.apply(assignment(shard_index=1, node_id="node-b", gpu_indices=(0,), term=5)) == set()
    assert ledger.apply(scheduled(term=5)) == set()  # the stale placement itself releases nothing
    assert ledger.gpus_of("node-a") == (0,) and ledger.gpus_of("node-b") == ()


def test_a_newer_leaders_placement_releases_what_the_older_one_reserved() -> None:
    ledger = Ledger()
    ledger.apply(assignment(shard_index=0, node_id="node-a", gpu_indices=(0,), term=5))
    ledger.apply(assignment(shard_index=0, node_id="node-b", gpu_indices=(1,), term=7))  # read first: other partition

    assert ledger.apply(scheduled("job-1", "node-b", term=7)) == {"node-a"}
    assert ledger.gpus_of("node-a") == () and ledger.gpus_of("node-b") == (1,)


def test_a_recovery_plan_ends_its_attempts_reservations_not_the_next_ones() -> None:
    ledger = Ledger()
    ledger.apply(assignment(shard_index=0, gpu_indices=(0,), attempt=1))
    ledger.apply(assignment(shard_index=0, gpu_indices=(1,), attempt=2))  # the re-formed gang, read first
    plan = JobRecovering(
        occurred_at=at(5),
        job_id="job-1",
        attempt=1,
        cause=FailureCause.NODE_LOST,
        message="lost",
        retry_at=at(5),
        retries_used=1,
        retries_left=2,
    )

    assert ledger.apply(plan) == {"node-a"}
    assert ledger.gpus_of("node-a") == (1,)
