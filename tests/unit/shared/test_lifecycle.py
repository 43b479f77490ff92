from __future__ import annotations

import pytest

from shardyard.events import (
    FailureCause,
    JobAccepted,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPreempted,
    JobPreempting,
    JobReady,
    JobRecovering,
    JobRejected,
    JobResized,
    JobRunning,
    JobScheduled,
    JobStraggling,
    JobSucceeded,
    JobUnschedulable,
    JobWaiting,
    PendingReason,
    RejectReason,
    ResizeReason,
)
from shardyard.lifecycle import TERMINAL, TRANSITIONS, JobState, LifecycleFact, can_move, moves, target_state
from tests.unit.builders import T0, job_spec, scheduled

S = JobState


def test_every_state_has_an_entry() -> None:
    assert set(TRANSITIONS) == set(JobState)


def test_edges_stay_inside_the_state_set() -> None:
    for exits in TRANSITIONS.values():
        assert exits <= set(JobState)


@pytest.mark.parametrize("state", sorted(TERMINAL - {S.REJECTED}), ids=str)
def test_terminal_states_have_no_exits(state: JobState) -> None:
    assert TRANSITIONS[state] == frozenset()


def test_a_rejected_submission_may_only_be_resubmitted() -> None:
    assert TRANSITIONS[S.REJECTED] == frozenset({S.ACCEPTED})


def test_non_terminal_states_can_fail() -> None:
    for state in set(JobState) - TERMINAL:
        assert S.FAILED in TRANSITIONS[state], state


@pytest.mark.parametrize(
    ("current", "target", "allowed"),
    [
        pytest.param(None, S.ACCEPTED, True, id="new-accepted"),
        pytest.param(None, S.REJECTED, True, id="new-rejected"),
        pytest.param(None, S.RUNNING, False, id="new-running"),
        pytest.param(None, S.READY, False, id="new-ready"),
        pytest.param(None, S.SUCCEEDED, False, id="new-succeeded"),
        pytest.param(S.ACCEPTED, S.READY, True, id="accepted-ready"),
        pytest.param(S.ACCEPTED, S.WAITING, True, id="accepted-waiting"),
        pytest.param(S.ACCEPTED, S.RUNNING, False, id="accepted-running"),
        pytest.param(S.ACCEPTED, S.ACCEPTED, False, id="accepted-twice"),
        pytest.param(S.WAITING, S.READY, True, id="waiting-ready"),
        pytest.param(S.READY, S.SCHEDULED, True, id="ready-scheduled"),
        pytest.param(S.READY, S.RUNNING, False, id="ready-running"),
        pytest.param(S.SCHEDULED, S.RUNNING, True, id="scheduled-running"),
        pytest.param(S.SCHEDULED, S.SUCCEEDED, True, id="scheduled-succeeded-fast-gang"),
        pytest.param(S.SCHEDULED, S.READY, True, id="scheduled-requeued"),
        pytest.param(S.RUNNING, S.SUCCEEDED, True, id="running-succeeded"),
        pytest.param(S.RUNNING, S.FAILED, True, id="running-failed"),
        pytest.param(S.RUNNING, S.READY, True, id="running-requeued"),
        pytest.param(S.RUNNING, S.SCHEDULED, False, id="running-scheduled"),
        pytest.param(S.SUCCEEDED, S.RUNNING, False, id="succeeded-running"),
        pytest.param(S.SUCCEEDED, S.FAILED, False, id="succeeded-failed"),
        pytest.param(S.FAILED, S.RUNNING, False, id="failed-running"),
        pytest.param(S.FAILED, S.SUCCEEDED, False, id="failed-succeeded"),
        pytest.param(S.CANCELLED, S.READY, False, id="cancelled-ready"),
        pytest.param(S.REJECTED, S.READY, False, id="rejected-ready"),
        pytest.param(S.REJECTED, S.REJECTED, False, id="rejected-twice"),
        pytest.param(S.REJECTED, S.ACCEPTED, True, id="rejected-resubmitted"),
    ],
)
def test_can_move(current: JobState | None, target: JobState, allowed: bool) -> None:
    assert can_move(current, target) is allowed


_SPEC = job_spec()
_FAILED = JobFailed(occurred_at=T0, job_id="job-1", attempt=1, cause=FailureCause.NODE_LOST, message="lost")


@pytest.mark.parametrize(
    ("event", "state"),
    [
        pytest.param(
            JobAccepted(occurred_at=T0, job_id="job-1", spec=_SPEC, source_offset="s/0/1"), S.ACCEPTED, id="accepted"
        ),
        pytest.param(
            JobRejected(
                occurred_at=T0, job_id="job-1", reason=RejectReason.MISSING_FIELD, message="m", source_offset="s/0/1"
            ),
            S.REJECTED,
            id="rejected",
        ),
        pytest.param(JobReady(occurred_at=T0, job_id="job-1", spec=_SPEC), S.READY, id="ready"),
        pytest.param(
            JobUnschedulable(occurred_at=T0, job_id="job-1", reason=PendingReason.NO_FIT, message="m"),
            None,
            id="unschedulable-keeps-state",
        ),
        pytest.param(scheduled(), S.SCHEDULED, id="scheduled"),
        pytest.param(JobRunning(occurred_at=T0, job_id="job-1", attempt=1), S.RUNNING, id="running"),
        pytest.param(
            JobSucceeded(occurred_at=T0, job_id="job-1", attempt=1, final_loss=1.0, checkpoint_dir=None),
            S.SUCCEEDED,
            id="succeeded",
        ),
        pytest.param(_FAILED, S.FAILED, id="failed"),
        pytest.param(
            JobWaiting(occurred_at=T0, job_id="job-1", reason=PendingReason.WAITING_FOR_DEPENDENCY, message="m"),
            S.WAITING,
            id="waiting",
        ),
        pytest.param(
            JobPreempting(occurred_at=T0, job_id="job-1", attempt=1, by_job="vip", deadline_s=30),
            None,
            id="preempting-keeps-state",
        ),
        pytest.param(
            JobPreempted(
                occurred_at=T0, job_id="job-1", attempt=1, by_job="vip", checkpoint_dir=None, checkpoint_step=None
            ),
            S.READY,
            id="preempted-requeues",
        ),
        pytest.param(JobCancelRequested(occurred_at=T0, job_id="job-1"), None, id="cancel-request-keeps-state"),
        pytest.param(JobCancelled(occurred_at=T0, job_id="job-1", message="m"), S.CANCELLED, id="cancelled"),
        pytest.param(
            JobRecovering(
                occurred_at=T0,
                job_id="job-1",
                attempt=1,
                cause=FailureCause.NODE_LOST,
                message="m",
                retry_at=T0,
                retries_used=1,
                retries_left=2,
            ),
            S.READY,
            id="recovering-requeues",
        ),
        pytest.param(
            JobResized(
                occurred_at=T0,
                job_id="job-1",
                attempt=1,
                from_shards=2,
                to_shards=4,
                reason=ResizeReason.GROW_INTO_IDLE,
            ),
            S.READY,
            id="resized-requeues-for-its-next-attempt",
        ),
    ],
)
def test_target_state(event: LifecycleFact, state: JobState | None) -> None:
    assert target_state(event) is state


def test_target_state_table_covers_every_lifecycle_event_class() -> None:
    classes = {
        JobAccepted,
        JobRejected,
        JobReady,
        JobWaiting,
        JobUnschedulable,
        JobScheduled,
        JobRunning,
        JobSucceeded,
        JobFailed,
        JobRecovering,
        JobPreempting,
        JobPreempted,
        JobResized,
        JobStraggling,
        JobCancelRequested,
        JobCancelled,
    }
    assert set(LifecycleFact.__args__) == classes  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("current", "moved"),
    [
        (JobState.ACCEPTED, JobState.READY),
        (JobState.WAITING, JobState.READY),
        (JobState.READY, None),
        (JobState.SCHEDULED, None),
        (JobState.RUNNING, None),
        (JobState.SUCCEEDED, None),
        (None, None),
    ],
)
def test_a_release_moves_only_a_held_job(current: JobState | None, moved: JobState | None) -> None:
    """A queue replica that lost its partitions can publish a release its successor published too; the second,
    landing after the job started, must not take the job back to READY (a requeue is JobPreempted)."""
    release = JobReady(occurred_at=T0, job_id="j", spec=job_spec(job_id="j"))

    assert moves(current, release) is moved


def test_a_requeue_moves_a_running_job_back_to_ready() -> None:
    requeued = JobPreempted(
        occurred_at=T0, job_id="j", attempt=1, by_job="k", checkpoint_dir=None, checkpoint_step=None
    )

    assert moves(JobState.RUNNING, requeued) is JobState.READY
