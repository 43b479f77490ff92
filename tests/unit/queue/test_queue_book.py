from __future__ import annotations

import pytest

from shardyard.bus.topics import SUBMISSIONS, partition_of
from shardyard.events import (
    Event,
    FailureCause,
    JobAccepted,
    JobFailed,
    JobReady,
    JobRejected,
    JobRunning,
    JobSucceeded,
    JobWaiting,
    RejectReason,
)
from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.lifecycle import JobState
from shardyard.queue.book import Forward, QueueBook
from tests.unit.builders import EXAMPLE, at, raw, scheduled, submission

TOPIC = "shardyard.jobs.submissions"
GOOD = EXAMPLE.read_bytes()
JOB = "fine_tune_gpt2"


def src(offset: int, partition: int = 0) -> str:
    return f"{TOPIC}/{partition}/{offset}"


def _kinds(events: list[Event]) -> list[type]:
    return [type(e) for e in events]


def test_accepted_submission_yields_accepted_then_ready() -> None:
    book = QueueBook(DEFAULT_TFLOPS)

    events = book.on_submission(GOOD, source=src(1), now=at(1))

    assert _kinds(events) == [JobAccepted, JobReady]
    accepted, ready = events
    assert isinstance(accepted, JobAccepted) and isinstance(ready, JobReady)
    assert accepted.job_id == ready.job_id == JOB
    assert accepted.source_offset == src(1)
    assert accepted.spec == ready.spec
    assert accepted.occurred_at == accepted.spec.submitted_at == at(1)
    assert book.states[JOB] is JobState.READY


def test_redelivered_offset_is_a_no_op() -> None:
    book = QueueBook(DEFAULT_TFLOPS)
    book.on_submission(GOOD, source=src(1), now=at(1))

    assert book.on_submission(GOOD, source=src(1), now=at(2)) == []


def test_redelivered_rejection_is_a_no_op() -> None:
    book = QueueBook(DEFAULT_TFLOPS)
    book.on_submission(b"nope", source=src(3), now=at(1))

    assert book.on_submission(b"nope", source=src(3), now=at(2)) == []


@pytest.mark.parametrize(
    "history",
    [
        pytest.param([], id="ready"),
        pytest.param([scheduled(JOB)], id="scheduled"),
        pytest.param([scheduled(JOB), JobRunning(occurred_at=at(3), job_id=JOB, attempt=1)], id="running"),
    ],
)
def test_second_submission_of_an_active_job_is_a_duplicate(history: list[Event]) -> None:
    book = QueueBook(DEFAULT_TFLOPS)
    book.on_submission(GOOD, source=src(1), now=at(1))
    for event in history:
        book.apply(event)  # type: ignore[arg-type]
    state = book.states[JOB]

    (event,) = book.on_submission(GOOD, source=src(2), now=at(5))

    assert isinstance(event, JobRejected)
    assert (event.job_id, event.reason, event.source_offset) == (JOB, RejectReason.DUPLICATE_JOB, src(2))
    assert book.states[JOB] is state


def test_a_finished_job_id_cannot_be_reused() -> None:
    book = QueueBook(DEFAULT_TFLOPS)
    book.on_submission(GOOD, source=src(1), now=at(1))
    book.apply(JobFailed(occurred_at=at(2), job_id=JOB, attempt=1, cause=FailureCause.NODE_LOST, message="lost"))

    (event,) = book.on_submission(GOOD, source=src(2), now=at(3))

    assert isinstance(event, JobRejected) and event.reason is RejectReason.DUPLICATE_JOB


def test_rejection_uses_the_fallback_id_without_a_task_id() -> None:
    book = QueueBook(DEFAULT_TFLOPS)

    (event,) = book.on_submission(b"[1, 2]", source=src(17, partition=3), now=at(1))

    assert isinstance(event, JobRejected)
    assert (event.job_id, event.reason) == ("invalid-3-17", RejectReason.NOT_AN_OBJECT)
    assert book.states["invalid-3-17"] is JobState.REJECTED


def test_rejected_job_may_be_resubmitted() -> None:
    book = QueueBook(DEFAULT_TFLOPS)
    (rejected,) = book.on_submission(raw(submission(gpus=2)), source=src(1), now=at(1))
    assert isinstance(rejected, JobRejected) and rejected.job_id == JOB

    events = book.on_submission(GOOD, source=src(2), now=at(2))

    assert _kinds(events) == [JobAccepted, JobReady]


def test_resubmitted_job_is_tracked_as_ready() -> None:
    book = QueueBook(DEFAULT_TFLOPS)
    book.on_submission(raw(submission(gpus=2)), source=src(1), now=at(1))
    book.on_submission(GOOD, source=src(2), now=at(2))

    assert book.states[JOB] is JobState.READY


def test_resubmitted_job_is_protected_from_duplicates() -> None:
    book = QueueBook(DEFAULT_TFLOPS)
    book.on_submission(raw(submission(gpus=2)), source=src(1), now=at(1))
    book.on_submission(GOOD, source=src(2), now=at(2))

    (event,) = book.on_submission(GOOD, source=src(3), now=at(3))

    assert isinstance(event, JobRejected) and event.reason is RejectReason.DUPLICATE_JOB


def test_replaying_the_log_rebuilds_states_and_sources() -> None:
    live = QueueBook(DEFAULT_TFLOPS)
    log = [
        *live.on_submission(GOOD, source=src(1), now=at(1)),
        *live.on_submission(b"x", source=src(2), now=at(2)),
        scheduled(JOB),
        JobRunning(occurred_at=at(3), job_id=JOB, attempt=1),
    ]
    replayed = QueueBook(DEFAULT_TFLOPS)

    for event in log:
        replayed.apply(event)  # type: ignore[arg-type]

    assert replayed.states == {JOB: JobState.RUNNING, "invalid-0-2": JobState.REJECTED}
    assert replayed.on_submission(GOOD, source=src(1), now=at(9)) == []
    (duplicate,) = replayed.on_submission(GOOD, source=src(4), now=at(9))
    assert isinstance(duplicate, JobRejected) and duplicate.reason is RejectReason.DUPLICATE_JOB


def test_apply_ignores_illegal_moves() -> None:
    book = QueueBook(DEFAULT_TFLOPS)
    book.on_submission(GOOD, source=src(1), now=at(1))
    book.apply(JobFailed(occurred_at=at(2), job_id=JOB, attempt=1, cause=FailureCause.KILLED, message="k"))

    book.apply(JobRunning(occurred_at=at(3), job_id=JOB, attempt=1))

    assert book.states[JOB] is JobState.FAILED


# --- replicas split the jobs by submissions partition -----------------------------------------------------------------
def _partition(job_id: str) -> int:
    return partition_of(job_id, SUBMISSIONS)


def test_a_submission_read_on_another_partition_goes_to_its_job_s() -> None:
    book = QueueBook(DEFAULT_TFLOPS, owned=frozenset(range(SUBMISSIONS.partitions)))
    home = _partition(JOB)
    elsewhere = (home + 1) % SUBMISSIONS.partitions

    assert book.forward_to(GOOD, source=src(1, elsewhere), partition=elsewhere) == Forward(JOB, home)
    assert book.forward_to(GOOD, source=src(1, elsewhere), partition=home) is None  # arrived: decide it here
    # An invalid document that names its job is decided by that job's owner too (the same id, one decider) ...
    invalid = raw(submission(shard_count="many"))
    assert book.forward_to(invalid, source=src(2, elsewhere), partition=elsewhere) == Forward(JOB, home)
    # ... bytes that name no job are rejected where they are read, under an id made of where that is ...
    for nameless in (b"\x00not json", raw([1, 2]), raw(submission(task_id="no spaces allowed"))):
        assert book.forward_to(nameless, source=src(3, elsewhere), partition=elsewhere) is None
    # ... and a submission already decided is a no-op wherever it is read again.
    book.on_submission(GOOD, source=src(1, elsewhere), now=at(1))
    assert book.forward_to(GOOD, source=src(1, elsewhere), partition=elsewhere) is None


def test_a_replica_settles_only_the_jobs_of_its_partitions() -> None:
    parent = "parent-job"
    children = {_partition(f"child-{i}"): f"child-{i}" for i in range(100)}
    assert len(children) == SUBMISSIONS.partitions
    mine = frozenset({0, 1})
    whole = QueueBook(DEFAULT_TFLOPS)  # every fact a replica follows comes from the whole queue
    facts = whole.on_submission(raw(submission(task_id=parent)), source=src(1), now=at(1))
    for offset, child in enumerate(children.values(), start=2):
        facts += whole.on_submission(raw(submission(task_id=child, depends_on=[parent])), source=src(offset), now=at(1))

    replica = QueueBook(DEFAULT_TFLOPS, owned=mine)
    for fact in facts:
        assert isinstance(fact, JobAccepted | JobReady | JobWaiting)
        replica.apply(fact)
    decided = replica.on_lifecycle(scheduled(parent, "n1"), at(3))
    end = JobSucceeded(occurred_at=at(3), job_id=parent, attempt=1, final_loss=1.0, checkpoint_dir=None)
    decided += replica.on_lifecycle(end, at(3))

    assert sorted(e.job_id for e in decided) == sorted(children[p] for p in mine)
    assert all(isinstance(e, JobReady) for e in decided)
    # Given the other partitions, it settles what their owner left undone, once.
    replica.owned = frozenset(range(SUBMISSIONS.partitions))
    taken = replica.reconcile(at(4))
    assert sorted(e.job_id for e in taken) == sorted(children[p] for p in set(children) - mine)
    assert replica.reconcile(at(5)) == []
