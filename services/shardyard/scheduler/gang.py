"""Gangs (placed jobs) as the scheduler book tracks them, and the revocation of one of their shards. Pure; the
snapshot a cycle decides on is built from them by ``shardyard.placement.snapshot``."""

from dataclasses import dataclass, field
from datetime import datetime

from shardyard.events import (
    JobScheduled,
    JobSpec,
    ShardCompleted,
    ShardPlacement,
    ShardPreempted,
    ShardRevocation,
)


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
    unlisted: dict[int, datetime] = field(default_factory=dict)
    """Training shards its node's state left out of its running shards, since the first check that found so (see
    ``orphans``); the leader's own bookkeeping, not a fact of the log."""


def revocation(gang: Gang, shard: ShardPlacement, *, term: int, now: datetime, reason: str) -> ShardRevocation:
    """Stop one shard of ``gang``'s attempt (its agent stops it; the pool frees its GPUs)."""
    return ShardRevocation(
        occurred_at=now,
        job_id=gang.spec.job_id,
        shard_index=shard.shard_index,
        node_id=shard.node_id,
        attempt=gang.scheduled.attempt,
        term=term,
        reason=reason,
    )
