"""Gangs (placed jobs) as the scheduler book tracks them, each taking in the facts of its own attempt, and the
revocation of their shards. Pure; the snapshot a cycle decides on is built from them by
``shardyard.placement.snapshot``."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shardyard.events import (
    JobPreempting,
    JobRunning,
    JobScheduled,
    JobSpec,
    RevocationReason,
    ShardCheckpointed,
    ShardCompleted,
    ShardFailed,
    ShardPlacement,
    ShardPreempted,
    ShardRevocation,
    ShardStarted,
)

GangFact = JobPreempting | JobRunning | ShardStarted | ShardFailed | ShardCompleted | ShardPreempted | ShardCheckpointed
"""The facts of a gang's attempt that its record keeps."""


@dataclass
class Gang:
    spec: JobSpec
    scheduled: JobScheduled
    started: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    """Shards reported failed (by their agent, or by the scheduler at their start deadline)."""
    completed: dict[int, ShardCompleted] = field(default_factory=dict)
    preempted: dict[int, ShardPreempted] = field(default_factory=dict)
    running: bool = False
    preempted_by: str | None = None
    preempt_deadline: datetime | None = None
    checkpointed_at: datetime | None = None
    """When this attempt last wrote a durable checkpoint (rank 0's ``ShardCheckpointed``): preemption weighs the work
    since (``RunningJob.lost_gpu_s``)."""
    restart_s: float | None = None
    """What this attempt's start cost, placement to every shard running: the estimate of a restart's cost."""
    unlisted: dict[int, datetime] = field(default_factory=dict)
    """Training shards its node's state left out of its running shards, since the first check that found so (see
    ``orphans``); the leader's own bookkeeping, not a fact of the log."""

    @property
    def size(self) -> int:
        """Its training shards in this attempt (its world size): the spec's ``shard_count``, or for an elastic job the
        size it was placed at."""
        return sum(1 for shard in self.scheduled.placements if not shard.spare)

    def record(self, fact: GangFact) -> None:
        """Take in a fact of this gang's attempt."""
        match fact:
            case JobPreempting():
                self.preempted_by = fact.by_job
                self.preempt_deadline = fact.occurred_at + timedelta(seconds=fact.deadline_s)
            case ShardStarted() if fact.shard_index not in self.failed:  # after its start deadline: too late
                self.started.add(fact.shard_index)
            case ShardFailed():
                self.failed.add(fact.shard_index)
            case ShardCompleted():
                self.completed[fact.shard_index] = fact
            case ShardPreempted():
                self.preempted[fact.shard_index] = fact
            case ShardCheckpointed():
                if self.checkpointed_at is None or fact.occurred_at > self.checkpointed_at:
                    self.checkpointed_at = fact.occurred_at
            case JobRunning():
                self.running = True
                self.restart_s = max(0.0, (fact.occurred_at - self.scheduled.occurred_at).total_seconds())


def revocation(
    gang: Gang, shard: ShardPlacement, reason: RevocationReason, message: str, *, term: int, now: datetime
) -> ShardRevocation:
    """Stop one shard of ``gang``'s attempt (its agent stops it; the pool frees its GPUs)."""
    return ShardRevocation(
        occurred_at=now,
        job_id=gang.spec.job_id,
        shard_index=shard.shard_index,
        node_id=shard.node_id,
        attempt=gang.scheduled.attempt,
        term=term,
        reason=reason,
        message=message,
    )


def revoke_unfinished(
    gang: Gang, reason: RevocationReason, message: str, *, term: int, now: datetime
) -> list[ShardRevocation]:
    """Stop every shard of ``gang``'s attempt, spares included, that has not ended on its own: a completed shard,
    or one stopped on a preemption request, holds nothing. A failed one is revoked too: its agent may not know."""
    return [
        revocation(gang, shard, reason, message, term=term, now=now)
        for shard in gang.scheduled.placements
        if shard.shard_index not in gang.completed and shard.shard_index not in gang.preempted
    ]
