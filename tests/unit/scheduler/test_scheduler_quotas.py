"""The scheduler book under a queues configuration (the queues topic's latest): an idle queue's quota is borrowed,
and reclaimed for its team through checkpoint-then-requeue, the team's job placed within one preemption deadline;
a new configuration is in force at the next cycle."""

from __future__ import annotations

from shardyard.events import (
    Event,
    JobPreempted,
    JobPreempting,
    JobReady,
    JobScheduled,
    JobUnschedulable,
    PendingReason,
    QueuesConfigured,
    ShardStopRequest,
)
from shardyard.quotas import parse_queues
from shardyard.scheduler.book import SchedulerBook
from tests.unit.builders import at, gpus, job_spec, node_state, started

QUEUES = "min_runtime_s: 5\nqueues:\n  a: {cohort: lab, gpus: {A100: 1}}\n  b: {cohort: lab, gpus: {A100: 1}}\n"
DEADLINE_S = 30.0


def configured(text: str = QUEUES, at_s: float = 0.0) -> QueuesConfigured:
    return QueuesConfigured(
        occurred_at=at(at_s), config=parse_queues(text), version="c" * 64, source="q.yaml", published_by="test"
    )


def ready(job_id: str, queue: str, count: int, when: float) -> JobReady:
    spec = job_spec(job_id=job_id, queue=queue, gpu_count=count, submitted_at=at(when))
    return JobReady(occurred_at=at(when), job_id=job_id, spec=spec)


def of(events: list[Event], kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind)]


def borrowing() -> SchedulerBook:
    """Two A100s; queue a's 2-GPU gang runs on its own one and b's idle one, borrowed."""
    book = SchedulerBook(preempt_deadline_s=DEADLINE_S)
    book.apply(configured())
    book.apply(node_state("node-a", gpus=gpus(count=2)))
    book.apply(ready("big", "a", 2, 0))
    (placed,) = of(book.cycle(at(1)), JobScheduled)
    book.apply(placed)
    for shard in (0, 1):
        book.apply(started("big", shard))
    book.on_shard_event(at(2))
    return book


def test_a_borrowed_gang_is_reclaimed_for_its_lender_within_one_preemption_deadline() -> None:
    book = borrowing()
    book.apply(ready("small", "b", 1, 10))

    asked = book.cycle(at(10))

    (marker,) = of(asked, JobPreempting)
    assert (marker.job_id, marker.by_job, marker.deadline_s) == ("big", "small", DEADLINE_S)
    assert len(of(asked, ShardStopRequest)) == 2
    book.apply(marker)
    # The borrower does not stop by itself: at the deadline it is revoked and requeued, and the lender's job placed.
    assert of(book.cycle(at(10 + DEADLINE_S - 1)), JobScheduled) == []
    ended = book.cycle(at(10 + DEADLINE_S))
    assert [e.job_id for e in of(ended, JobPreempted)] == ["big"]
    assert [e.job_id for e in of(ended, JobScheduled)] == ["small"]

    # Requeued, the borrower waits on quota while the lender uses its A100, naming its queue and the model.
    (waits,) = of(ended, JobUnschedulable)
    assert waits.job_id == "big" and waits.reason is PendingReason.QUOTA_EXCEEDED
    assert "queue a" in waits.message and "A100" in waits.message


def test_a_borrower_within_its_guaranteed_runtime_is_not_reclaimed() -> None:
    book = borrowing()
    book.apply(ready("small", "b", 1, 3))  # big has run 2 s of its 5

    decided = book.cycle(at(3))

    assert of(decided, JobPreempting) == []
    (waits,) = of(decided, JobUnschedulable)
    assert waits.job_id == "small"


def test_a_new_configuration_is_in_force_at_the_next_cycle() -> None:
    book = SchedulerBook()
    book.apply(node_state("node-a", gpus=gpus(count=2)))
    book.apply(configured("queues:\n  a: {gpus: {A100: 1}}\n"))
    book.apply(ready("two", "a", 2, 0))
    (waits,) = of(book.cycle(at(1)), JobUnschedulable)
    assert waits.reason is PendingReason.QUOTA_EXCEEDED

    book.apply(configured("queues:\n  a: {gpus: {A100: 2}}\n", at_s=2))

    assert [e.job_id for e in of(book.cycle(at(3)), JobScheduled)] == ["two"]
