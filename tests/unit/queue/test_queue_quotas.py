"""Admission by the queues in force: a queue the configuration does not have, and a job its queue could never hold
(more GPUs than its nominal plus all it could borrow, more CPU or memory than its quota), are rejected, typed."""

import pytest

from shardyard.events import JobAccepted, JobRejected, QueuesConfigured, RejectReason
from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.queue.book import QueueBook
from shardyard.quotas import parse_queues
from tests.unit.builders import at, raw, submission

QUEUES = """
queues:
  team-a: {cohort: lab, gpus: {A100: 2}, cpu: 16, borrow: {A100: 1}}
  team-b: {cohort: lab, gpus: {A100: 4, V100: 8}}
  solo: {gpus: {V100: 2}}
"""


def configured(text: str = QUEUES) -> QueuesConfigured:
    return QueuesConfigured(
        occurred_at=at(0), config=parse_queues(text), version="0" * 64, source="queues.yaml", published_by="test"
    )


def verdict(book: QueueBook, offset: int, **fields: object) -> JobAccepted | JobRejected:
    document = submission(task_id=f"job-{offset}", **fields)
    first = book.on_submission(raw(document), source=f"shardyard.jobs.submissions/0/{offset}", now=at(offset))[0]
    assert isinstance(first, JobAccepted | JobRejected)
    return first


def gpus(count: int, model: str = "A100", cpu: int = 8) -> dict[str, object]:
    return {"gpu": {"count": count, "model": model}, "memory": "64GiB", "cpu_cores": cpu}


@pytest.mark.parametrize(
    ("fields", "reason", "named"),
    [
        ({"queue": "team-a", "resource_requirements": gpus(3), "shard_count": 3}, None, ""),  # 2 own + 1 borrowed
        ({"queue": "team-a", "resource_requirements": gpus(4), "shard_count": 4}, "QUOTA_NEVER_FITS", "A100: 3"),
        ({"queue": "team-b", "resource_requirements": gpus(6), "shard_count": 6}, None, ""),  # 4 own + team-a's 2
        ({"queue": "team-b", "resource_requirements": gpus(7), "shard_count": 7}, "QUOTA_NEVER_FITS", "A100: 6"),
        ({"queue": "team-a", "resource_requirements": gpus(2, cpu=32)}, "QUOTA_NEVER_FITS", "32 CPU cores"),
        ({"queue": "solo", "resource_requirements": gpus(2, "V100")}, None, ""),
        ({"queue": "solo", "resource_requirements": gpus(2)}, "QUOTA_NEVER_FITS", "A100: 0"),
        ({"queue": "team-c"}, "UNKNOWN_QUEUE", "team-a, team-b"),
        ({}, "UNKNOWN_QUEUE", "'default'"),  # no queue named: the default queue, which this file does not have
    ],
)
def test_a_job_its_queue_could_never_hold_is_rejected_typed(
    fields: dict[str, object], reason: str | None, named: str
) -> None:
    book = QueueBook(DEFAULT_TFLOPS)
    book.queues = configured()

    answer = verdict(book, 1, **fields)

    if reason is None:
        assert isinstance(answer, JobAccepted), answer
        return
    assert isinstance(answer, JobRejected) and answer.reason is RejectReason(reason), answer
    assert named in answer.message, answer.message
    assert [error.field for error in answer.errors] == ["queue"]


def test_without_a_queues_configuration_any_queue_is_accepted() -> None:
    book = QueueBook(DEFAULT_TFLOPS)

    assert isinstance(verdict(book, 1, queue="anything"), JobAccepted)


def test_a_new_configuration_judges_the_next_submission() -> None:
    book = QueueBook(DEFAULT_TFLOPS)
    book.queues = configured()
    assert isinstance(verdict(book, 1, queue="team-c"), JobRejected)

    book.queues = configured(QUEUES + "  team-c: {gpus: {A100: 2}}\n")

    assert isinstance(verdict(book, 2, queue="team-c"), JobAccepted)
