"""Preemption of a placed gang for a higher-priority job. Pure: time comes in.

The victim's training shards are asked to checkpoint and stop (``ShardStopRequest``); they stop together at their
next parameter sync and rank 0 saves. The gang ends ``JobPreempted`` (requeued, to resume from that checkpoint) once
every training shard has stopped or completed, or at the preemption deadline, when whatever still runs is revoked.
The book records the preemption on the gang (``preempted_by``, ``preempt_deadline``) from ``JobPreempting``, a fact
of the log, so a new leader carries on one its predecessor began.
"""

from datetime import datetime

from shardyard.events import (
    JobPreempted,
    JobPreempting,
    RevocationReason,
    ShardRevocation,
    ShardStopRequest,
    StopReason,
)
from shardyard.scheduler.gang import Gang, revoke_unfinished


def preempting(
    gang: Gang, by_job: str, *, term: int, deadline_s: float, now: datetime
) -> tuple[JobPreempting, list[ShardStopRequest]]:
    """The marker that starts the preemption, and a stop request for every training shard not completed yet
    (spares hold GPUs but run nothing, so they have nothing to save)."""
    job_id, attempt = gang.scheduled.job_id, gang.scheduled.attempt
    marker = JobPreempting(occurred_at=now, job_id=job_id, attempt=attempt, by_job=by_job, deadline_s=deadline_s)
    requests = [
        ShardStopRequest(
            occurred_at=now,
            job_id=job_id,
            shard_index=shard.shard_index,
            node_id=shard.node_id,
            attempt=attempt,
            term=term,
            reason=StopReason.PREEMPTED,
            message=f"preempted by {by_job}",
        )
        for shard in gang.scheduled.placements
        if shard.shard_index not in gang.completed and not shard.spare
    ]
    return marker, requests


def overdue(gang: Gang, now: datetime) -> bool:
    """Whether ``gang`` is being preempted and its shards did not all stop by the deadline."""
    return gang.preempt_deadline is not None and now >= gang.preempt_deadline


def revoke_overdue(gang: Gang, *, term: int, now: datetime) -> list[ShardRevocation]:
    """Past the deadline the gang's GPUs are taken back without a checkpoint: the job resumes from an older one."""
    message = f"preempted by {gang.preempted_by}: no checkpoint in time"
    return revoke_unfinished(gang, RevocationReason.PREEMPTION_TIMEOUT, message, term=term, now=now)


def all_stopped(gang: Gang) -> bool:
    """Whether every training shard stopped on the request or had completed, at least one of them stopped."""
    return bool(gang.preempted) and len(gang.preempted) + len(gang.completed) == gang.size


def preempted(gang: Gang, resume_from: str | None, now: datetime) -> JobPreempted:
    """The end of the preemption: the job is requeued, to resume from rank 0's checkpoint (any stopped shard's when
    rank 0 had completed), else from ``resume_from``, the job's last checkpoint before."""
    lead = gang.preempted.get(0) or next(iter(gang.preempted.values()), None)
    checkpoint = lead.checkpoint_dir if lead is not None else None
    return JobPreempted(
        occurred_at=now,
        job_id=gang.scheduled.job_id,
        attempt=gang.scheduled.attempt,
        by_job=gang.preempted_by or "",
        checkpoint_dir=checkpoint or resume_from,
        checkpoint_step=lead.step if lead is not None and checkpoint else None,
    )
