"""The job lifecycle as a transition table. Events from several services meet on the lifecycle topic; a consumer
applies one only when the table allows the move, so late or duplicated events cannot revive a finished job."""

from types import MappingProxyType
from typing import Final

from shardyard.events import (
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
)
from shardyard.events.job import LifecycleFact  # the one list of lifecycle events; declared beside them
from shardyard.job_state import TERMINAL as TERMINAL
from shardyard.job_state import JobState as JobState

TRANSITIONS: Final = MappingProxyType(
    {
        # Validated; the queue checks its dependencies next.
        JobState.ACCEPTED: frozenset({JobState.WAITING, JobState.READY, JobState.FAILED, JobState.CANCELLED}),
        # Refused at the door. Only a corrected resubmission under the same id follows.
        JobState.REJECTED: frozenset({JobState.ACCEPTED}),
        # Held for a dependency; released when it is met, failed when it never can be.
        JobState.WAITING: frozenset({JobState.READY, JobState.FAILED, JobState.CANCELLED}),
        # Eligible for placement; stays READY (with a pending reason) while nothing fits.
        JobState.READY: frozenset({JobState.SCHEDULED, JobState.FAILED, JobState.CANCELLED}),
        # Assignments published; RUNNING once every shard started. A gang that finishes before the RUNNING event
        # is seen goes straight to its end state.
        JobState.SCHEDULED: frozenset(
            {JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.READY}
        ),
        # Training; READY again when it is requeued (preemption, recovery by re-placement), or when its elastic gang
        # is resized: the scheduler places its next attempt at once, at the new size, and no retry is used.
        JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.READY}),
        JobState.SUCCEEDED: frozenset(),
        JobState.FAILED: frozenset(),
        JobState.CANCELLED: frozenset(),
    }
)


def target_state(event: LifecycleFact) -> JobState | None:
    """The state an event moves a job to; None for events that only update the pending reason."""
    match event:
        case JobAccepted():
            return JobState.ACCEPTED
        case JobRejected():
            return JobState.REJECTED
        case JobReady() | JobPreempted() | JobRecovering() | JobResized():
            return JobState.READY
        case JobWaiting():
            return JobState.WAITING
        case JobCancelled():
            return JobState.CANCELLED
        case JobScheduled():
            return JobState.SCHEDULED
        case JobRunning():
            return JobState.RUNNING
        case JobSucceeded():
            return JobState.SUCCEEDED
        case JobFailed():
            return JobState.FAILED
        case JobUnschedulable() | JobPreempting() | JobCancelRequested() | JobStraggling():
            return None


RELEASED_FROM: Final = frozenset({JobState.ACCEPTED, JobState.WAITING})
"""The states a release (``JobReady``) moves a job from: a requeue is ``JobPreempted``, ``JobRecovering`` or
``JobResized``."""


def moves(current: JobState | None, event: LifecycleFact) -> JobState | None:
    """The state ``event`` moves a job in ``current`` to; None when it moves nothing (it updates only a reason, or
    the table refuses it: late or duplicated). A release moves only a held job, so a release published twice (a
    queue replica that lost its partitions publishing what its successor published too), the second after the job
    started, moves nothing."""
    target = target_state(event)
    if target is None or (isinstance(event, JobReady) and current not in RELEASED_FROM):
        return None
    return target if can_move(current, target) else None


def can_move(current: JobState | None, target: JobState) -> bool:
    """True when a job in ``current`` (None: not seen yet) may move to ``target``."""
    if current is None:
        return target in (JobState.ACCEPTED, JobState.REJECTED)
    return target in TRANSITIONS[current]
