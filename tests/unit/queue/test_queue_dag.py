"""Job dependencies in the queue's book: admission checks, release on success, fail or hold on failure, propagation,
and the replay/reconcile split (``apply`` never decides; ``reconcile`` repairs a crash)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from shardyard.events import (
    Event,
    FailureCause,
    JobAccepted,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobReady,
    JobRejected,
    JobSucceeded,
    JobWaiting,
    PendingReason,
    RejectReason,
)
from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.lifecycle import JobState, LifecycleFact
from shardyard.queue.book import QueueBook
from tests.unit.builders import at, job_spec, raw, scheduled, submission

TOPIC = "shardyard.jobs.submissions"


class Queue:
    """A book plus a log of everything it published, with short ways to submit jobs and report their ends."""

    def __init__(self) -> None:
        self.book = QueueBook(DEFAULT_TFLOPS)
        self.log: list[Event] = []
        self.offset = 0

    def submit(self, job_id: str, *depends_on: str, **fields: Any) -> list[Event]:
        self.offset += 1
        document = submission(task_id=job_id, depends_on=list(depends_on), **fields)
        out = self.book.on_submission(raw(document), source=f"{TOPIC}/0/{self.offset}", now=at(self.offset))
        self.log.extend(out)
        return out

    def fact(self, event: LifecycleFact) -> list[Event]:
        self.log.append(event)
        out: list[Event] = [*self.book.on_lifecycle(event, at(100))]
        self.log.extend(out)
        return out

    def succeed(self, job_id: str) -> list[Event]:
        if self.state(job_id) is JobState.READY:
            self.fact(scheduled(job_id))  # READY cannot end SUCCEEDED without a placement
        return self.fact(
            JobSucceeded(occurred_at=at(50), job_id=job_id, attempt=1, final_loss=1.0, checkpoint_dir=None)
        )

    def fail(self, job_id: str) -> list[Event]:
        return self.fact(
            JobFailed(occurred_at=at(50), job_id=job_id, attempt=1, cause=FailureCause.NODE_LOST, message="lost")
        )

    def cancel(self, job_id: str) -> list[Event]:
        return self.fact(JobCancelled(occurred_at=at(50), job_id=job_id, message="cancelled by cli"))

    def end(self, job_id: str, how: str) -> list[Event]:
        return {"succeed": self.succeed, "fail": self.fail, "cancel": self.cancel}[how](job_id)

    def state(self, job_id: str) -> JobState | None:
        return self.book.states.get(job_id)


def kinds(events: Sequence[Event]) -> list[tuple[str, str]]:
    return [(type(e).__name__, e.job_id) for e in events]  # type: ignore[attr-defined]


def queue_with(*parents: str) -> Queue:
    queue = Queue()
    for parent in parents:
        queue.submit(parent)
    return queue


# --- admission ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("depends_on", "unknown"),
    [
        pytest.param(("ghost",), ["ghost"], id="never-seen"),
        pytest.param(("p", "ghost", "spook"), ["ghost", "spook"], id="names-only-the-unknown"),
        pytest.param(("bad",), ["bad"], id="rejected-parent"),
    ],
)
def test_unknown_dependency_is_rejected(depends_on: tuple[str, ...], unknown: list[str]) -> None:
    queue = queue_with("p")
    queue.submit("bad", gpus=2)
    assert queue.state("bad") is JobState.REJECTED

    (event,) = queue.submit("child", *depends_on)

    assert isinstance(event, JobRejected)
    assert (event.job_id, event.reason) == ("child", RejectReason.UNKNOWN_DEPENDENCY)
    (error,) = event.errors
    assert error.field == "depends_on" and error.input == str(unknown).replace("'", '"')
    assert all(repr(job) in event.message for job in unknown)
    assert "'p'" not in event.message
    assert queue.state("child") is JobState.REJECTED


def test_a_dependency_cycle_is_rejected() -> None:
    # Only a log written by hand (or a queue of another version) can hold b -> a while a is unknown or rejected;
    # the queue still refuses to close the loop.
    queue = Queue()
    queue.submit("a", gpus=2)
    queue.book.apply(
        JobAccepted(occurred_at=at(1), job_id="b", spec=job_spec(job_id="b", depends_on=("a",)), source_offset="x/0/9")
    )

    (event,) = queue.submit("a", "b")

    assert isinstance(event, JobRejected)
    assert event.reason is RejectReason.DEPENDENCY_CYCLE
    assert "a -> b -> a" in event.message
    assert [e.field for e in event.errors] == ["depends_on"]


@pytest.mark.parametrize(
    ("parent_end", "policy", "expected", "state"),
    [
        pytest.param("succeed", "fail", "JobReady", JobState.READY, id="parent-succeeded"),
        pytest.param("fail", "fail", "JobFailed", JobState.FAILED, id="parent-failed-fail"),
        pytest.param("cancel", "fail", "JobFailed", JobState.FAILED, id="parent-cancelled-fail"),
        pytest.param("fail", "hold", "JobWaiting", JobState.WAITING, id="parent-failed-hold"),
        pytest.param(None, "fail", "JobWaiting", JobState.WAITING, id="parent-unfinished"),
    ],
)
def test_admission_settles_the_job_against_its_parents(
    parent_end: str | None, policy: str, expected: str, state: JobState
) -> None:
    queue = queue_with("p")
    if parent_end:
        queue.end("p", parent_end)

    events = queue.submit("child", "p", on_dependency_failure=policy)

    assert kinds(events) == [("JobAccepted", "child"), (expected, "child")]
    assert isinstance(events[0], JobAccepted) and events[0].spec.depends_on == ("p",)
    assert queue.state("child") is state


def test_waiting_names_the_unfinished_parents() -> None:
    queue = queue_with("a", "b", "c")
    queue.succeed("b")

    _, waiting = queue.submit("child", "a", "b", "c")

    assert isinstance(waiting, JobWaiting)
    assert (waiting.reason, waiting.waiting_for) == (PendingReason.WAITING_FOR_DEPENDENCY, ("a", "c"))
    assert "'a', 'c'" in waiting.message


# --- release -----------------------------------------------------------------------------------------------------
def test_parent_success_releases_the_child_once() -> None:
    queue = queue_with("p")
    queue.submit("child", "p")

    (ready,) = queue.succeed("p")

    assert isinstance(ready, JobReady) and ready.job_id == "child" and ready.spec.depends_on == ("p",)
    assert queue.state("child") is JobState.READY
    assert queue.succeed("p") == []
    queue.fact(ready)  # the queue's own output coming back
    assert queue.succeed("p") == []


def test_late_duplicate_success_does_not_requeue_a_scheduled_child() -> None:
    queue = queue_with("p")
    queue.submit("child", "p")
    queue.succeed("p")
    queue.fact(scheduled("child"))

    assert queue.succeed("p") == []
    assert queue.state("child") is JobState.SCHEDULED


def test_child_of_two_parents_waits_for_both_and_says_for_which() -> None:
    queue = queue_with("a", "b")
    queue.submit("child", "a", "b")

    (update,) = queue.succeed("a")
    assert isinstance(update, JobWaiting) and update.waiting_for == ("b",)
    assert queue.succeed("a") == []

    assert kinds(queue.succeed("b")) == [("JobReady", "child")]


def test_siblings_are_each_released() -> None:
    queue = queue_with("p")
    queue.submit("c1", "p")
    queue.submit("c2", "p")

    assert sorted(kinds(queue.succeed("p"))) == [("JobReady", "c1"), ("JobReady", "c2")]


# --- failure -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("how", "end"), [("fail", "FAILED"), ("cancel", "CANCELLED")])
def test_parent_end_fails_a_fail_child(how: str, end: str) -> None:
    queue = queue_with("p")
    queue.submit("child", "p")

    (failed,) = queue.end("p", how)

    assert isinstance(failed, JobFailed)
    assert (failed.job_id, failed.cause, failed.attempt) == ("child", FailureCause.DEPENDENCY_FAILED, 0)
    assert f"'p' ended {end}" in failed.message
    assert queue.end("p", how) == []


def test_parent_failure_holds_a_hold_child() -> None:
    queue = queue_with("p")
    queue.submit("child", "p", on_dependency_failure="hold")

    (held,) = queue.fail("p")

    assert isinstance(held, JobWaiting)
    assert (held.reason, held.waiting_for) == (PendingReason.DEPENDENCY_FAILED, ("p",))
    assert queue.state("child") is JobState.WAITING
    assert queue.fail("p") == []
    queue.fact(held)
    assert queue.fail("p") == []


def test_failure_propagates_down_the_graph() -> None:
    queue = queue_with("a")
    queue.submit("b", "a")
    queue.submit("c", "b")
    queue.submit("d", "c", on_dependency_failure="hold")
    queue.submit("e", "d")

    events = queue.fail("a")

    assert kinds(events) == [("JobFailed", "b"), ("JobFailed", "c"), ("JobWaiting", "d")]
    assert isinstance(events[1], JobFailed) and "'b' ended FAILED" in events[1].message
    assert queue.state("e") is JobState.WAITING


def test_cancelling_a_held_child_fails_its_own_children() -> None:
    queue = queue_with("a")
    queue.submit("b", "a", on_dependency_failure="hold")
    queue.submit("c", "b")
    queue.fail("a")

    events = queue.fact(JobCancelRequested(occurred_at=at(60), job_id="b"))

    assert kinds(events) == [("JobCancelled", "b"), ("JobFailed", "c")]


# --- replay and reconcile ------------------------------------------------------------------------------------------
def replayed(log: list[Event]) -> QueueBook:
    book = QueueBook(DEFAULT_TFLOPS)
    for event in log:
        book.apply(event)  # type: ignore[arg-type]
    return book


def test_apply_only_records() -> None:
    queue = queue_with("p")
    queue.submit("child", "p")

    queue.book.apply(JobSucceeded(occurred_at=at(9), job_id="p", attempt=1, final_loss=None, checkpoint_dir=None))

    assert queue.state("child") is JobState.WAITING


def test_replaying_a_complete_log_leaves_nothing_to_reconcile() -> None:
    queue = queue_with("a", "b")
    queue.submit("c1", "a")
    queue.submit("c2", "a", "b", on_dependency_failure="hold")
    queue.submit("c3", "b")
    queue.succeed("a")
    queue.fail("b")

    book = replayed(queue.log)

    assert book.states == queue.book.states
    assert book.waiting == queue.book.waiting
    assert book.reconcile(at(200)) == []
    for event in queue.log:  # the live consumer re-reads the log after the replay: nothing new follows
        assert book.on_lifecycle(event, at(300)) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cut", "expected"),
    [
        pytest.param("JobReady", [("JobReady", "solo")], id="accepted-but-never-released"),
        pytest.param("JobWaiting", [("JobWaiting", "child")], id="accepted-but-never-held"),
    ],
)
def test_reconcile_finishes_an_interrupted_admission(cut: str, expected: list[tuple[str, str]]) -> None:
    queue = queue_with("p")
    queue.submit("solo")
    queue.submit("child", "p")
    log = [e for e in queue.log if not (type(e).__name__ == cut and e.job_id in ("solo", "child"))]  # type: ignore[attr-defined]

    book = replayed(log)

    assert kinds(book.reconcile(at(200))) == expected
    assert book.reconcile(at(201)) == []


def test_reconcile_releases_a_child_whose_release_was_lost() -> None:
    queue = queue_with("p")
    queue.submit("child", "p")
    queue.succeed("p")  # the crash: the child's JobReady never reached the log
    log = [e for e in queue.log if not isinstance(e, JobReady) or e.job_id != "child"]

    book = replayed(log)

    assert book.states["child"] is JobState.WAITING
    (ready,) = book.reconcile(at(200))
    assert isinstance(ready, JobReady) and ready.job_id == "child"
    assert book.reconcile(at(201)) == []


def test_reconcile_propagates_a_lost_failure() -> None:
    queue = queue_with("a")
    queue.submit("b", "a")
    queue.submit("c", "b")
    queue.fail("a")
    log = [e for e in queue.log if not (isinstance(e, JobFailed) and e.cause is FailureCause.DEPENDENCY_FAILED)]

    book = replayed(log)

    assert kinds(book.reconcile(at(200))) == [("JobFailed", "b"), ("JobFailed", "c")]
