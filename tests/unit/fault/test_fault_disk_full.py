"""A shard that failed DISK_FULL moves its job to a disk with room at once, outside the retry budget; with no room
elsewhere (or its moves spent) it is a retry like any other, and the scheduler's disk filter holds the job until a
disk has room. The rule as a table (``recovery.free_move``), then the fault book working out where there is room."""

from __future__ import annotations

import pytest

from shardyard.events import DiskSpace, FailureCause, JobRecovering, NodeStatus, ShardCause
from shardyard.fault_manager.book import FaultBook
from shardyard.fault_manager.recovery import FailedAttempt, RetryPolicy, outcome
from tests.unit.builders import GIB, at, failed, node_state, scheduled

C = FailureCause
POLICY = RetryPolicy(max_retries=3, disk_floor_bytes=GIB, disk_full_moves=2)


def cause(kind: FailureCause, shard_index: int = 0, node_id: str = "node-a") -> ShardCause:
    return ShardCause(shard_index=shard_index, node_id=node_id, cause=kind, message=f"{kind.value} here")


def attempt(
    *causes: ShardCause, room: tuple[str, ...] = ("node-b",), moves_used: int = 0, retries_used: int = 0
) -> FailedAttempt:
    return FailedAttempt(
        job_id="job-1",
        attempt=5,
        causes=causes,
        bad_nodes=frozenset(),
        retries_used=retries_used,
        room=room,
        moves_used=moves_used,
    )


@pytest.mark.parametrize(
    ("failed_attempt", "moves"),
    [
        pytest.param(attempt(cause(C.DISK_FULL)), True, id="room-elsewhere-moves-free"),
        pytest.param(attempt(cause(C.DISK_FULL), retries_used=3), True, id="even-with-the-budget-spent"),
        pytest.param(
            attempt(cause(C.DISK_FULL), cause(C.COMM_ERROR, 1, "node-b")), True, id="the-peers-comm-errors-follow"
        ),
        pytest.param(attempt(cause(C.DISK_FULL), room=()), False, id="no-room-anywhere-counts"),
        pytest.param(attempt(cause(C.DISK_FULL), moves_used=2), False, id="moves-spent-counts"),
        pytest.param(attempt(cause(C.DISK_FULL), cause(C.PROCESS_EXIT, 1, "node-b")), False, id="with-a-crash-counts"),
        pytest.param(attempt(cause(C.PROCESS_EXIT)), False, id="a-crash-counts"),
    ],
)
def test_a_full_disk_moves_the_job_outside_the_retry_budget_while_another_node_has_room(
    failed_attempt: FailedAttempt, moves: bool
) -> None:
    plan = outcome(failed_attempt, POLICY, at(7))

    assert isinstance(plan, JobRecovering)
    assert plan.counted is not moves
    if moves:
        assert (plan.retries_used, plan.retry_at) == (failed_attempt.retries_used, at(7))
        assert plan.avoid_nodes == ("node-a",) and plan.exclude_nodes == ()
        assert "moving off the full disk at once (room on node-b)" in plan.message
        assert f"move {failed_attempt.moves_used + 1} of 2" in plan.message
    else:
        assert plan.retries_used == failed_attempt.retries_used + 1
        assert plan.avoid_nodes == ()  # nowhere else to go: the disk filter holds the job until a disk has room


def disk(free: int) -> DiskSpace:
    return DiskSpace(path="/data/checkpoints", free_bytes=free, total_bytes=100 * GIB)


def disks(t: float, **free: int | None) -> list[object]:
    return [
        node_state(node_id.replace("_", "-"), occurred_at=at(t), output_disk=None if f is None else disk(f))
        for node_id, f in free.items()
    ]


def full(t: float, attempt: int = 1) -> object:
    return failed(node_id="node-a", attempt=attempt, occurred_at=at(t), cause=C.DISK_FULL, message="no space")


def decide(book: FaultBook, t: float, *facts: object) -> JobRecovering:
    for fact in facts:
        book.apply(fact)
    (plan,) = book.decide(at(t))
    assert isinstance(plan, JobRecovering)
    book.apply(plan)
    return plan


@pytest.mark.parametrize(
    ("others", "room"),
    [
        pytest.param({"node_b": 10 * GIB}, ("node-b",), id="room-on-node-b"),
        pytest.param({"node_b": GIB // 2}, (), id="node-b-below-the-floor"),
        pytest.param({"node_b": None}, (), id="node-b-reports-no-disk"),
        pytest.param({"node_b": 10 * GIB, "node_c": 10 * GIB}, ("node-b", "node-c"), id="room-on-two"),
    ],
)
def test_the_book_moves_the_job_where_a_node_reports_room(others: dict[str, int | None], room: tuple[str, ...]) -> None:
    book = FaultBook(policy=POLICY)

    plan = decide(book, 2, scheduled("job-1", "node-a"), *disks(1, node_a=0, **others), full(2))

    assert plan.counted is not bool(room)
    assert plan.cause is C.DISK_FULL
    if room:
        assert plan.retries_used == 0 and plan.avoid_nodes == ("node-a",)
        assert f"room on {', '.join(room)}" in plan.message


@pytest.mark.parametrize(
    ("status", "draining"),
    [pytest.param(NodeStatus.SUSPECT, False, id="suspect"), pytest.param(NodeStatus.ALIVE, True, id="draining")],
)
def test_a_node_that_cannot_take_shards_has_no_room(status: NodeStatus, draining: bool) -> None:
    book = FaultBook(policy=POLICY)
    node_b = node_state("node-b", occurred_at=at(1), status=status, draining=draining, output_disk=disk(10 * GIB))

    plan = decide(book, 2, scheduled("job-1", "node-a"), node_b, full(2))

    assert plan.counted


def test_moves_are_bounded_then_count_and_the_book_rebuilds_them_from_the_log() -> None:
    book = FaultBook(policy=POLICY)
    facts: list[object] = [*disks(0, node_a=0, node_b=10 * GIB)]
    plans = []
    for attempt in (1, 2, 3):
        placed = scheduled("job-1", "node-a", attempt=attempt, occurred_at=at(10 * attempt))
        plans.append(decide(book, 10 * attempt + 1, *facts, placed, full(10 * attempt + 1, attempt)))
        facts = []

    assert [p.counted for p in plans] == [False, False, True]
    assert [p.retries_used for p in plans] == [0, 0, 1]
    replayed = FaultBook(policy=POLICY)
    for fact in [*disks(0, node_a=0, node_b=10 * GIB), *plans[:2]]:
        replayed.apply(fact)
    assert len(replayed.jobs["job-1"].moves) == 2


def test_a_node_the_job_was_excluded_from_is_no_room_for_it() -> None:
    book = FaultBook(policy=POLICY)
    gang = scheduled("job-1", "node-a")
    plan = decide(book, 2, gang, *disks(1, node_a=0, node_b=10 * GIB), failed(cause=C.IO_ERROR, node_id="node-b"))
    assert plan.exclude_nodes == ("node-b",)

    again = decide(book, 12, scheduled("job-1", "node-a", attempt=2, occurred_at=at(10)), full(12, attempt=2))

    assert again.counted  # node-b had room, but the job may not go there
