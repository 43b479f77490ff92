"""The fault book: which failures of which attempt become one recovery plan, or the job's end, and when."""

from __future__ import annotations

import random

import pytest

from shardyard.bus.topics import SHARD_EVENTS, partition_of
from shardyard.events import (
    Event,
    FailureCause,
    JobCancelRequested,
    JobFailed,
    JobPreempting,
    JobRecovering,
    JobResized,
    JobSucceeded,
    NodeLost,
    NodeState,
    NodeStatus,
    ResizeReason,
    ShardCause,
    ShardPlacement,
)
from shardyard.fault_manager.book import FaultBook
from shardyard.fault_manager.recovery import RetryPolicy
from tests.unit.builders import assignment, at, completed, failed, node_state, scheduled

C = FailureCause


def lost(node_id: str, t: float = 12.0, silent: float = 10.0) -> NodeLost:
    return NodeLost(occurred_at=at(t), node_id=node_id, last_heartbeat_at=at(t - silent), silent_for_s=silent)


def state(node_id: str, status: NodeStatus, t: float) -> NodeState:
    return node_state(node_id, status=status, occurred_at=at(t), last_heartbeat_at=at(t - 3))


def book_with(*facts: object, policy: RetryPolicy | None = None) -> FaultBook:
    book = FaultBook(policy=policy or RetryPolicy())
    for fact in facts:
        book.apply(fact)
    return book


def fail(book: FaultBook, now: float, *facts: object) -> list[Event]:
    for fact in facts:
        book.apply(fact)
    return book.decide(at(now))


def one(events: list[Event]) -> Event:
    assert len(events) == 1, events
    return events[0]


GANG = scheduled("job-1", "node-a", "node-b")


@pytest.mark.parametrize("cause", [C.USER_ERROR, C.MISSING_ARTIFACT], ids=str)
def test_the_jobs_own_faults_fail_it_at_once(cause: FailureCause) -> None:
    book = book_with(GANG)

    event = one(fail(book, 5, failed(shard_index=1, node_id="node-b", cause=cause, message="no dataset")))

    assert isinstance(event, JobFailed)
    assert (event.job_id, event.attempt, event.cause, event.occurred_at) == ("job-1", 1, cause, at(5))
    assert event.causes == (ShardCause(shard_index=1, node_id="node-b", cause=cause, message="no dataset"),)
    assert "shard 1 on node-b" in event.message and "no dataset" in event.message
    assert fail(book, 6, failed(shard_index=0, cause=C.COMM_ERROR)) == []


@pytest.mark.parametrize(
    ("cause", "excluded"),
    [
        pytest.param(C.PROCESS_EXIT, (), id="process-exit"),
        pytest.param(C.KILLED, (), id="killed"),
        pytest.param(C.SYNC_TIMEOUT, (), id="sync-timeout"),
        pytest.param(C.OOM, ("node-b",), id="oom"),
        pytest.param(C.GPU_FAULT, ("node-b",), id="gpu-fault"),
        pytest.param(C.LAUNCH_ERROR, ("node-b",), id="launch-error"),
        pytest.param(C.NODE_LOST, ("node-b",), id="node-lost"),
        pytest.param(C.START_TIMEOUT, ("node-b",), id="start-timeout-decided-at-once-off-the-node"),
        pytest.param(C.FENCED, (), id="fenced-node-never-suspected"),
    ],
)
def test_other_failures_become_one_recovery_per_attempt(cause: FailureCause, excluded: tuple[str, ...]) -> None:
    book = book_with(GANG)

    plan = one(fail(book, 5, failed(shard_index=1, node_id="node-b", cause=cause)))

    assert isinstance(plan, JobRecovering)
    assert (plan.job_id, plan.attempt, plan.cause, plan.exclude_nodes) == ("job-1", 1, cause, excluded)
    assert (plan.retries_used, plan.retries_left, plan.retry_at) == (1, 2, at(5))
    assert fail(book, 6, failed(shard_index=1, node_id="node-b", cause=cause)) == [], "redelivered"
    assert fail(book, 6, failed(shard_index=0, cause=C.COMM_ERROR)) == [], "the peer's error after the plan"
    assert book.decide(at(60)) == []


def test_revoked_shards_are_not_faults() -> None:
    assert fail(book_with(GANG), 5, failed(cause=C.REVOKED)) == []


# -- COMM_ERROR waits for its culprit ----------------------------------------------------------------------------


def test_comm_errors_alone_wait_out_the_grace_then_recover_without_exclusion() -> None:
    book = book_with(GANG, policy=RetryPolicy(comm_grace_s=3.5))

    assert fail(book, 1, failed(shard_index=0, node_id="node-a", cause=C.COMM_ERROR, occurred_at=at(1))) == []
    assert fail(book, 2, failed(shard_index=1, node_id="node-b", cause=C.COMM_ERROR, occurred_at=at(2))) == []
    assert book.decide(at(4.4)) == []
    plan = one(book.decide(at(4.5)))

    assert isinstance(plan, JobRecovering)
    assert (plan.cause, plan.exclude_nodes, plan.retry_at) == (C.COMM_ERROR, (), at(4.5))
    assert [c.shard_index for c in plan.causes] == [0, 1]


def test_a_silent_shards_node_is_waited_for_past_the_comm_grace_and_then_excluded() -> None:
    """The peer of a shard on a dead node reports COMM_ERROR at once; the dead node's agent reports nothing, and its
    SUSPECT verdict may come after the COMM_ERROR grace on a loaded control plane. Deciding at the grace would
    re-form the gang on the dead node; the plan waits for the verdict instead."""
    book = book_with(GANG, state("node-b", NodeStatus.ALIVE, 0), policy=RetryPolicy(comm_grace_s=3.5))
    assert fail(book, 1, failed(shard_index=0, node_id="node-a", cause=C.COMM_ERROR, occurred_at=at(1))) == []

    assert book.decide(at(6)) == [], "shard 1 said nothing: its node's verdict is awaited"
    plan = one(fail(book, 7, state("node-b", NodeStatus.SUSPECT, 7)))

    assert isinstance(plan, JobRecovering)
    assert (plan.cause, plan.exclude_nodes) == (C.NODE_LOST, ("node-b",))


def test_a_silent_shard_is_waited_for_up_to_the_silent_grace() -> None:
    book = book_with(GANG, policy=RetryPolicy(comm_grace_s=3.5, silent_grace_s=10))
    assert fail(book, 1, failed(shard_index=0, node_id="node-a", cause=C.COMM_ERROR, occurred_at=at(1))) == []

    assert book.decide(at(10.9)) == []
    plan = one(book.decide(at(11)))

    assert isinstance(plan, JobRecovering) and (plan.cause, plan.exclude_nodes) == (C.COMM_ERROR, ())


def test_a_shard_that_completed_is_not_silent() -> None:
    book = book_with(GANG, completed(shard_index=1, node_id="node-b"), policy=RetryPolicy(comm_grace_s=3.5))
    assert fail(book, 1, failed(shard_index=0, node_id="node-a", cause=C.COMM_ERROR, occurred_at=at(1))) == []

    assert isinstance(one(book.decide(at(4.5))), JobRecovering)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(state("node-b", NodeStatus.SUSPECT, 2), id="suspect"),
        pytest.param(state("node-b", NodeStatus.LOST, 2), id="lost"),
        pytest.param(lost("node-b", t=2), id="node-lost-event"),
    ],
)
def test_comm_errors_are_decided_at_once_when_a_gang_node_goes_bad(bad: object) -> None:
    book = book_with(GANG, state("node-b", NodeStatus.ALIVE, 0))
    assert fail(book, 1, failed(shard_index=0, node_id="node-a", cause=C.COMM_ERROR, occurred_at=at(1))) == []

    plan = one(fail(book, 2, bad))

    assert isinstance(plan, JobRecovering)
    assert plan.exclude_nodes == ("node-b",)
    assert plan.cause is C.NODE_LOST
    assert [(c.shard_index, c.node_id, c.cause) for c in plan.causes] == [
        (0, "node-a", C.COMM_ERROR),
        (1, "node-b", C.NODE_LOST),
    ]


def test_comm_errors_are_decided_at_once_when_the_culprit_reports() -> None:
    book = book_with(GANG)
    assert fail(book, 1, failed(shard_index=0, node_id="node-a", cause=C.COMM_ERROR)) == []

    plan = one(fail(book, 1.2, failed(shard_index=1, node_id="node-b", cause=C.GPU_FAULT)))

    assert isinstance(plan, JobRecovering)
    assert (plan.cause, plan.exclude_nodes) == (C.GPU_FAULT, ("node-b",))
    assert [c.cause for c in plan.causes] == [C.COMM_ERROR, C.GPU_FAULT]


# -- nodes that go bad -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(state("node-b", NodeStatus.SUSPECT, 5), id="suspect"),
        pytest.param(state("node-b", NodeStatus.LOST, 5), id="lost"),
        pytest.param(lost("node-b", t=5), id="node-lost-event"),
    ],
)
def test_a_node_that_goes_bad_under_a_running_gang_recovers_it_without_any_shard_failure(bad: object) -> None:
    book = book_with(
        scheduled("job-1", "node-a", "node-b"),
        scheduled("job-2", "node-b", "node-b"),
        scheduled("job-3", "node-c"),
    )

    plans = fail(book, 5, bad)

    assert all(isinstance(p, JobRecovering) and p.cause is C.NODE_LOST for p in plans)
    by_job = {p.job_id: p for p in plans if isinstance(p, JobRecovering)}
    assert sorted(by_job) == ["job-1", "job-2"]
    assert by_job["job-1"].exclude_nodes == ("node-b",)
    assert [(c.shard_index, c.node_id) for c in by_job["job-1"].causes] == [(1, "node-b")]
    assert [c.shard_index for c in by_job["job-2"].causes] == [0, 1]
    assert fail(book, 6, state("node-b", NodeStatus.LOST, 6), lost("node-b", t=7)) == []


def test_gangs_from_assignments_are_followed_too() -> None:
    book = book_with(assignment("job-1", 0, "node-a"), assignment("job-1", 1, "node-b"))

    plan = one(fail(book, 5, state("node-b", NodeStatus.SUSPECT, 5)))

    assert isinstance(plan, JobRecovering) and plan.exclude_nodes == ("node-b",)


def spare_gang() -> object:
    spare = ShardPlacement(
        shard_index=2, node_id="node-s", gpu_indices=(0,), gpu_model="A100", match_score=1.0, spare=True
    )
    return scheduled("job-1", "node-a", "node-b").model_copy(update={"placements": (*GANG.placements, spare)})


def test_a_spares_node_going_bad_does_not_stop_the_gang_but_is_excluded_from_its_recovery() -> None:
    book = book_with(spare_gang())

    assert fail(book, 5, state("node-s", NodeStatus.SUSPECT, 5)) == []
    plan = one(fail(book, 6, failed(shard_index=0, node_id="node-a", cause=C.KILLED)))

    assert isinstance(plan, JobRecovering) and plan.exclude_nodes == ("node-s",)


def test_a_spares_node_going_bad_is_no_culprit_for_comm_errors() -> None:
    book = book_with(spare_gang(), policy=RetryPolicy(comm_grace_s=3.5))

    assert fail(book, 1, failed(shard_index=0, node_id="node-a", cause=C.COMM_ERROR, occurred_at=at(1))) == []
    assert fail(book, 1, failed(shard_index=1, node_id="node-b", cause=C.COMM_ERROR, occurred_at=at(1))) == []
    assert fail(book, 2, state("node-s", NodeStatus.SUSPECT, 2)) == []
    plan = one(book.decide(at(4.5)))

    assert isinstance(plan, JobRecovering) and (plan.cause, plan.exclude_nodes) == (C.COMM_ERROR, ("node-s",))


def test_a_bad_state_older_than_the_placement_does_not_hit_it() -> None:
    book = book_with(state("node-b", NodeStatus.SUSPECT, 1), scheduled("job-1", "node-a", "node-b", occurred_at=at(2)))

    assert book.decide(at(3)) == []
    plan = one(fail(book, 4, state("node-b", NodeStatus.LOST, 4)))
    assert isinstance(plan, JobRecovering)


def test_a_bad_state_newer_than_the_placement_hits_it_whichever_arrives_first() -> None:
    book = FaultBook()
    assert fail(book, 3, state("node-b", NodeStatus.SUSPECT, 3)) == []

    plan = one(fail(book, 3.1, scheduled("job-1", "node-a", "node-b", occurred_at=at(2))))

    assert isinstance(plan, JobRecovering) and plan.exclude_nodes == ("node-b",)


def test_older_node_news_is_ignored() -> None:
    book = book_with(GANG, state("node-b", NodeStatus.ALIVE, 5))

    assert fail(book, 6, state("node-b", NodeStatus.SUSPECT, 4)) == []


def test_shards_that_already_completed_are_not_hit() -> None:
    book = book_with(GANG, completed(shard_index=1, node_id="node-b"))

    assert fail(book, 5, state("node-b", NodeStatus.SUSPECT, 5)) == []


# -- attempts ----------------------------------------------------------------------------------------------------


def test_the_retry_budget_ends_the_job_listing_every_cause_of_every_attempt() -> None:
    book = book_with(policy=RetryPolicy(max_retries=3, backoff_s=2.0))
    plans: list[Event] = []
    causes = [C.KILLED, C.OOM, C.NODE_LOST, C.GPU_FAULT]
    for n, cause in enumerate(causes, start=1):
        book.apply(scheduled("job-1", f"node-{n}", "node-z", attempt=n, occurred_at=at(10 * n)))
        plans += fail(book, 10 * n + 1, failed(attempt=n, node_id=f"node-{n}", cause=cause, message=f"try {n}"))

    recoveries = [p for p in plans if isinstance(p, JobRecovering)]
    assert [(p.attempt, p.retries_used, p.retries_left) for p in recoveries] == [(1, 1, 2), (2, 2, 1), (3, 3, 0)]
    assert [p.retry_at for p in recoveries] == [at(11), at(23), at(35)], "backoff 0 s, 2 s, 4 s"
    final = plans[-1]
    assert isinstance(final, JobFailed)
    assert (final.attempt, final.cause) == (4, C.GPU_FAULT)
    assert [(c.cause, c.message) for c in final.causes] == [(c, f"try {n}") for n, c in enumerate(causes, start=1)]
    assert "failed after 4 attempts" in final.message
    assert fail(book, 60, failed(attempt=4, shard_index=1, node_id="node-z", cause=C.KILLED)) == []


@pytest.mark.parametrize(
    "facts",
    [
        pytest.param([scheduled(attempt=2)], id="scheduled-attempt-2"),
        pytest.param([assignment(attempt=2)], id="assignment-attempt-2"),
    ],
)
def test_failure_of_an_older_attempt_is_ignored(facts: list[object]) -> None:
    assert fail(book_with(*facts), 5, failed(attempt=1)) == []


def test_a_newer_placement_drops_the_undecided_failures_of_the_older_attempt() -> None:
    book = book_with(GANG)
    assert fail(book, 1, failed(cause=C.COMM_ERROR)) == []

    book.apply(scheduled("job-1", "node-c", attempt=2, occurred_at=at(2)))

    assert book.decide(at(30)) == []


@pytest.mark.parametrize(
    "end",
    [
        pytest.param(JobSucceeded(occurred_at=at(4), job_id="job-1", attempt=1, final_loss=1.0, checkpoint_dir=None)),
        pytest.param(JobFailed(occurred_at=at(4), job_id="job-1", attempt=1, cause=C.USER_ERROR, message="x")),
        pytest.param(JobCancelRequested(occurred_at=at(4), job_id="job-1")),
    ],
    ids=lambda e: type(e).__name__,
)
def test_nothing_is_decided_for_a_job_that_ended(end: object) -> None:
    book = book_with(GANG, end)

    assert fail(book, 5, failed(), state("node-b", NodeStatus.LOST, 5), lost("node-a", t=5)) == []


def test_a_gang_stopped_for_preemption_is_not_recovered() -> None:
    preempting = JobPreempting(occurred_at=at(3), job_id="job-1", attempt=1, by_job="job-9", deadline_s=30)
    book = book_with(GANG, preempting)

    assert fail(book, 40, failed(cause=C.REVOKED), failed(shard_index=1, cause=C.COMM_ERROR)) == []


def test_a_gang_re_formed_at_another_size_is_not_recovered_and_uses_no_retry() -> None:
    resized = JobResized(
        occurred_at=at(3),
        job_id="job-1",
        attempt=1,
        from_shards=2,
        to_shards=4,
        reason=ResizeReason.GROW_INTO_IDLE,
    )
    book = book_with(GANG, resized)

    assert fail(book, 40, failed(cause=C.KILLED), failed(shard_index=1, cause=C.COMM_ERROR)) == []


def test_a_failure_before_the_gang_is_known_is_still_decided() -> None:
    book = FaultBook()

    plan = one(fail(book, 5, failed(job_id="job-9", node_id="node-q", cause=C.LAUNCH_ERROR)))

    assert isinstance(plan, JobRecovering) and plan.exclude_nodes == ("node-q",)
    book.apply(scheduled("job-9", "node-q", attempt=1))
    assert fail(book, 6, failed(job_id="job-9", shard_index=1, cause=C.KILLED)) == []


# -- replay ------------------------------------------------------------------------------------------------------


FAILED_ATTEMPT_1: list[tuple[float, object]] = [
    (0, GANG),
    (0, state("node-b", NodeStatus.ALIVE, 0)),
    (5, failed(shard_index=1, node_id="node-b", cause=C.OOM, occurred_at=at(5))),
    (6, failed(shard_index=0, node_id="node-a", cause=C.COMM_ERROR, occurred_at=at(6))),
]
"""Facts up to a failed attempt, with the time each arrived."""
AFTER_THE_PLAN: list[tuple[float, object]] = [
    (8, scheduled("job-1", "node-a", "node-c", attempt=2, occurred_at=at(8))),
    (9, state("node-b", NodeStatus.LOST, 9)),
]


def history() -> tuple[list[object], list[Event]]:
    """A job's facts as the topics hold them, and the decisions a live book made from them."""
    book = FaultBook()
    decisions: list[Event] = []
    for t, fact in FAILED_ATTEMPT_1 + AFTER_THE_PLAN:
        book.apply(fact)
        decisions += book.decide(at(t))
    return [fact for _, fact in FAILED_ATTEMPT_1 + AFTER_THE_PLAN], decisions


def test_the_live_book_decides_once() -> None:
    _facts, decisions = history()

    plan = one(decisions)
    assert isinstance(plan, JobRecovering) and (plan.attempt, plan.exclude_nodes) == (1, ("node-b",))


@pytest.mark.parametrize("seed", range(5))
def test_replay_in_any_order_decides_nothing_twice_and_live_goes_on(seed: int) -> None:
    facts, decisions = history()
    replayed = [*facts, *decisions]
    random.Random(seed).shuffle(replayed)
    book = book_with(*replayed)

    assert book.decide(at(100)) == []
    plan = one(fail(book, 101, failed(attempt=2, shard_index=1, node_id="node-c", cause=C.KILLED)))
    assert isinstance(plan, JobRecovering)
    assert (plan.attempt, plan.retries_used, plan.retries_left, plan.retry_at) == (2, 2, 1, at(103))


def test_a_failure_left_undecided_by_a_crash_is_decided_after_the_replay() -> None:
    plan = one(book_with(*(fact for _, fact in FAILED_ATTEMPT_1)).decide(at(100)))

    assert isinstance(plan, JobRecovering) and plan.attempt == 1


# -- replicas split the jobs by shard-events partition -----------------------------------------------------------


def test_a_replica_decides_only_its_own_jobs_and_takes_the_others_over_undecided() -> None:
    book = book_with(GANG)
    job_partition = partition_of("job-1", SHARD_EVENTS)
    book.owned = frozenset(p for p in range(SHARD_EVENTS.partitions) if p != job_partition)

    assert fail(book, 5, failed(shard_index=1, node_id="node-b", cause=C.KILLED)) == []  # another replica's job

    book.owned = frozenset({job_partition})  # that replica died: its partition comes here
    plan = one(book.decide(at(6)))
    assert isinstance(plan, JobRecovering) and (plan.job_id, plan.attempt) == ("job-1", 1)


def test_a_replica_that_saw_the_owners_decision_does_not_decide_again() -> None:
    book = book_with(GANG)
    book.owned = frozenset()
    fail(book, 5, failed(shard_index=1, node_id="node-b", cause=C.KILLED))
    owner = book_with(GANG)
    decided = one(fail(owner, 5, failed(shard_index=1, node_id="node-b", cause=C.KILLED)))

    book.apply(decided)  # the owner's plan, followed from the lifecycle topic
    book.owned = None
    assert book.decide(at(6)) == []
