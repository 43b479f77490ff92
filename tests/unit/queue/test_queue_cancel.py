"""Cancel requests in the queue: it cancels the jobs it holds (ACCEPTED, WAITING) and leaves the rest alone."""

from __future__ import annotations

import pytest

from shardyard.events import (
    Event,
    FailureCause,
    JobAccepted,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobRunning,
    JobSucceeded,
)
from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.lifecycle import JobState, LifecycleFact
from shardyard.queue.book import QueueBook
from tests.unit.builders import at, job_spec, raw, scheduled, submission

TOPIC = "shardyard.jobs.submissions"


def request(job_id: str = "job", requested_by: str = "cli") -> JobCancelRequested:
    return JobCancelRequested(occurred_at=at(10), job_id=job_id, requested_by=requested_by)


def book_with(job_state: str) -> QueueBook:
    """A book holding ``job`` (child of ``parent``) in the named situation."""
    book = QueueBook(DEFAULT_TFLOPS)
    book.on_submission(raw(submission(task_id="parent")), source=f"{TOPIC}/0/1", now=at(1))
    history: list[LifecycleFact] = []
    match job_state:
        case "accepted":  # a crash after JobAccepted, before the hold was published
            spec = job_spec(job_id="job", depends_on=("parent",))
            history = [JobAccepted(occurred_at=at(2), job_id="job", spec=spec, source_offset=f"{TOPIC}/0/2")]
        case "waiting":
            book.on_submission(raw(submission(task_id="job", depends_on=["parent"])), source=f"{TOPIC}/0/2", now=at(2))
        case "held-after-failure":
            document = submission(task_id="job", depends_on=["parent"], on_dependency_failure="hold")
            book.on_submission(raw(document), source=f"{TOPIC}/0/2", now=at(2))
            history = [
                scheduled("parent"),
                JobFailed(occurred_at=at(3), job_id="parent", attempt=1, cause=FailureCause.KILLED, message="k"),
            ]
        case _:
            book.on_submission(raw(submission(task_id="job")), source=f"{TOPIC}/0/2", now=at(2))
            if job_state in ("scheduled", "running", "succeeded"):
                history.append(scheduled("job"))
            if job_state in ("running", "succeeded"):
                history.append(JobRunning(occurred_at=at(3), job_id="job", attempt=1))
            if job_state == "succeeded":
                history.append(
                    JobSucceeded(occurred_at=at(4), job_id="job", attempt=1, final_loss=1.0, checkpoint_dir=None)
                )
    for event in history:
        book.on_lifecycle(event, at(5))
    return book


@pytest.mark.parametrize(
    ("situation", "state"),
    [
        pytest.param("accepted", JobState.ACCEPTED, id="accepted"),
        pytest.param("waiting", JobState.WAITING, id="waiting-for-parent"),
        pytest.param("held-after-failure", JobState.WAITING, id="held-after-parent-failed"),
    ],
)
def test_a_held_job_is_cancelled(situation: str, state: JobState) -> None:
    book = book_with(situation)
    assert book.states["job"] is state

    (cancelled,) = book.on_lifecycle(request(requested_by="alice"), at(11))

    assert isinstance(cancelled, JobCancelled)
    assert (cancelled.job_id, cancelled.occurred_at) == ("job", at(11))
    assert "alice" in cancelled.message and state.lower() in cancelled.message
    assert book.states["job"] is JobState.CANCELLED


@pytest.mark.parametrize(
    ("situation", "state"),
    [
        pytest.param("ready", JobState.READY, id="ready-is-the-schedulers"),
        pytest.param("scheduled", JobState.SCHEDULED, id="scheduled-is-the-schedulers"),
        pytest.param("running", JobState.RUNNING, id="running-is-the-schedulers"),
        pytest.param("succeeded", JobState.SUCCEEDED, id="terminal-is-ignored"),
    ],
)
def test_other_states_are_left_to_the_scheduler(situation: str, state: JobState) -> None:
    book = book_with(situation)

    assert book.on_lifecycle(request(), at(11)) == []
    assert book.states["job"] is state


def test_unknown_job_is_ignored() -> None:
    assert QueueBook(DEFAULT_TFLOPS).on_lifecycle(request("nobody"), at(1)) == []


def test_a_request_is_carried_out_once() -> None:
    book = book_with("waiting")
    asked = request()
    book.on_lifecycle(asked, at(11))

    assert book.on_lifecycle(asked, at(12)) == []
    assert book.on_lifecycle(request(), at(12)) == []


def test_a_request_older_than_the_job_cancels_nothing() -> None:
    book = QueueBook(DEFAULT_TFLOPS)
    early = request("late-job")
    book.on_lifecycle(early, at(0))
    book.on_submission(raw(submission(task_id="parent")), source=f"{TOPIC}/0/1", now=at(1))
    book.on_submission(raw(submission(task_id="late-job", depends_on=["parent"])), source=f"{TOPIC}/0/2", now=at(2))

    assert book.on_lifecycle(early, at(3)) == []  # the live consumer re-reading the log
    assert book.reconcile(at(4)) == []
    assert book.states["late-job"] is JobState.WAITING


def test_reconcile_carries_out_a_request_the_queue_crashed_on() -> None:
    live = QueueBook(DEFAULT_TFLOPS)
    log: list[Event] = [
        *live.on_submission(raw(submission(task_id="parent")), source=f"{TOPIC}/0/1", now=at(1)),
        *live.on_submission(raw(submission(task_id="job", depends_on=["parent"])), source=f"{TOPIC}/0/2", now=at(2)),
        request(),  # seen, then the crash before JobCancelled was published
    ]
    replayed = QueueBook(DEFAULT_TFLOPS)
    for event in log:
        replayed.apply(event)  # type: ignore[arg-type]

    (cancelled,) = replayed.reconcile(at(20))

    assert isinstance(cancelled, JobCancelled) and cancelled.job_id == "job"
    assert replayed.reconcile(at(21)) == []
