"""What a gang's shard facts add up to: RUNNING once every training shard started, SUCCEEDED once every one completed
(the spares it still holds are released), PREEMPTED once every one stopped on the preemption request or completed.
Pure: time comes in; the book applies the events it returns, which is what keeps each one from being said twice.
"""

from datetime import datetime

from shardyard.events import Event, JobRunning, JobSucceeded, RevocationReason
from shardyard.scheduler import preemption
from shardyard.scheduler.gang import Gang, revoke_unfinished


def settle(gang: Gang, *, resume_from: str | None, term: int, now: datetime) -> list[Event]:
    """The gang-level events ``gang``'s shard facts call for now; ``resume_from`` is the job's last checkpoint, where
    a preempted gang resumes when its shards saved none."""
    count = gang.size
    out: list[Event] = []
    if not gang.running and len(gang.started) == count:
        out.append(JobRunning(occurred_at=now, job_id=gang.scheduled.job_id, attempt=gang.scheduled.attempt))
    if len(gang.completed) == count:
        out.extend(succeeded(gang, term=term, now=now))
    elif preemption.all_stopped(gang):
        out.append(preemption.preempted(gang, resume_from, now))
    return out


def succeeded(gang: Gang, *, term: int, now: datetime) -> list[Event]:
    """The job's end with rank 0's result, after the revocation of the spares it still holds."""
    message = "job succeeded: spare released"  # only spares are left unfinished
    released = revoke_unfinished(gang, RevocationReason.JOB_SUCCEEDED, message, term=term, now=now)
    lead = gang.completed.get(0) or next(iter(gang.completed.values()))
    end = JobSucceeded(
        occurred_at=now,
        job_id=gang.scheduled.job_id,
        attempt=gang.scheduled.attempt,
        final_loss=lead.final_loss,
        checkpoint_dir=lead.checkpoint_dir,
    )
    return [*released, end]
