"""The fault manager's answer to a straggler (``shardyard.fault_manager.stragglers``): a slow node's rank is swapped
out by a recovery that spends no retry, with the node avoided and counted degraded; no swap when there is no better
place, past the hour's limit, or when no node is to blame; each said in a ``JobStraggling``."""

from shardyard.events import (
    Event,
    FailureCause,
    JobRecovering,
    JobStraggling,
    NodeState,
    StragglerAction,
    StragglerKind,
)
from shardyard.fault_manager.book import FaultBook
from tests.unit.builders import at, gpus, node_state, progress, scheduled

GANG = ("node-0", "node-1", "node-2", "node-3")


def states(*, free_elsewhere: bool = True) -> list[NodeState]:
    """The gang's four nodes (one A100 each, taken) and node-4 (one A100, free when ``free_elsewhere``)."""
    taken = [node_state(n, gpus=gpus(count=1), allocated_gpus=(0,)) for n in GANG]
    spare = node_state("node-4", gpus=gpus(count=1), allocated_gpus=() if free_elsewhere else (0,))
    return [*taken, spare]


def reports(
    book: FaultBook,
    seconds: range,
    *,
    slow_rank: int | None = 2,
    attempt: int = 1,
    t0: float = 0.0,
    samples: float = 2.0,
) -> list[Event]:
    """One progress report a second from each rank (own time 100 ms, the slow rank's 200 ms); decided each second."""
    out: list[Event] = []
    for second in seconds:
        for rank, node in enumerate(GANG):
            own = 200.0 if rank == slow_rank else 100.0
            book.apply(
                progress(
                    "job-1",
                    rank,
                    attempt=attempt,
                    node_id=node,
                    occurred_at=at(t0 + second),
                    step=second,
                    compute_ms=own,
                    step_ms=200.0,
                    samples_per_s=samples * 1000.0 / 200.0,
                )
            )
        out.extend(book.decide(at(t0 + second)))
    return out


def book_with_gang(*, free_elsewhere: bool = True) -> FaultBook:
    book = FaultBook()
    for fact in [*states(free_elsewhere=free_elsewhere), scheduled("job-1", *GANG)]:
        book.apply(fact)
    return book


def test_a_slow_nodes_rank_is_swapped_out_without_spending_a_retry() -> None:
    book = book_with_gang()
    decided = reports(book, range(40))
    said, plan = decided
    assert isinstance(said, JobStraggling) and isinstance(plan, JobRecovering), decided
    assert (said.kind, said.action, said.shard_index, said.node_id) == (
        StragglerKind.SLOW_NODE,
        StragglerAction.SWAP,
        2,
        "node-2",
    )
    assert said.since == at(2) and "swapping it out" in said.message  # the window's first slow report
    assert plan.cause is FailureCause.STRAGGLER and plan.counted is False and plan.avoid_nodes == ("node-2",)
    assert plan.exclude_nodes == () and plan.retries_used == 0 and plan.retry_at == said.occurred_at
    assert book.stragglers.is_degraded("node-2", at(60)) and not book.stragglers.is_degraded("node-2", at(700))
    assert book.jobs["job-1"].moves == set()  # not a move off a full disk either


def test_no_better_place_is_said_and_nothing_is_swapped() -> None:
    decided = reports(book_with_gang(free_elsewhere=False), range(40))
    assert [(type(e).__name__, getattr(e, "action", None)) for e in decided] == [
        ("JobStraggling", StragglerAction.NO_BETTER_PLACE)
    ]


def test_an_imbalanced_job_is_said_and_not_swapped() -> None:
    book = book_with_gang()
    # Rank 2 takes twice the samples in twice the time: per sample it is as fast as the others.
    for second in range(40):
        for rank, node in enumerate(GANG):
            own, samples = (200.0, 4.0) if rank == 2 else (100.0, 2.0)
            book.apply(
                progress(
                    "job-1",
                    rank,
                    node_id=node,
                    occurred_at=at(second),
                    step=second,
                    compute_ms=own,
                    step_ms=200.0,
                    samples_per_s=samples * 1000.0 / 200.0,
                )
            )
    decided = book.decide(at(40))
    assert [(e.kind, e.action) for e in decided if isinstance(e, JobStraggling)] == [
        (StragglerKind.IMBALANCED_JOB, StragglerAction.NOT_A_NODE)
    ]
    assert not any(isinstance(e, JobRecovering) for e in decided)


def test_swaps_stop_at_the_hours_limit() -> None:
    book = book_with_gang()
    actions = []
    for attempt in (1, 2, 3):
        if attempt > 1:  # the scheduler re-formed it; its new attempt straggles again
            book.apply(scheduled("job-1", *GANG, attempt=attempt, occurred_at=at(100 * attempt)))
        decided = reports(book, range(40), attempt=attempt, t0=100.0 * attempt)
        actions += [e.action for e in decided if isinstance(e, JobStraggling)]
    assert actions == [StragglerAction.SWAP, StragglerAction.SWAP, StragglerAction.SWAP_LIMIT]


def test_a_healthy_gang_is_left_alone() -> None:
    assert reports(book_with_gang(), range(120), slow_rank=None) == []


def test_another_replicas_job_is_not_decided_here() -> None:
    book = book_with_gang()
    book.owned = frozenset()
    assert reports(book, range(40)) == []
