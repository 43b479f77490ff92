"""The start deadline of assignments: nobody holds GPUs for a shard that never starts. Pure: time comes in.

A training shard of a gang's current attempt that its agent has not reported started ``deadline_s`` after the gang
was placed is overdue: its agent took the assignment and died or hung before starting it. The scheduler revokes it
(the agent stops it should it start after all, and the resource pool frees its GPUs) and reports it failed with
``START_TIMEOUT`` on the agent's behalf, so the fault manager recovers the gang by the usual rules (a spare, or a
re-placement off that node, within the retry budget). The report is itself a fact of the shard's attempt: once the
book has it (as the leader decides, from the log after a failover, or replayed) the shard is not overdue again.

Never overdue: spares (they start nothing until promoted, which is a new attempt), shards reported started,
completed, failed or stopped on request, and every shard of a gang being preempted (the preemption has a deadline
of its own).
"""

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Final

from shardyard.events import Event, FailureCause, RevocationReason, ShardFailed, ShardPlacement
from shardyard.scheduler.gang import Gang, revocation

REVOKED_AS: Final[Mapping[RevocationReason, str]] = MappingProxyType(
    {RevocationReason.START_TIMEOUT: "start deadline", RevocationReason.ORPHANED: "orphaned"}
)
"""How the revocation's message names what the scheduler reports on an agent's behalf."""


def overdue(gang: Gang, now: datetime, deadline_s: float) -> list[ShardPlacement]:
    """The training shards of ``gang`` not reported started (nor ended) ``deadline_s`` after its placement. O(1) for
    a gang before its deadline, running (every shard started) or being preempted."""
    if gang.running or gang.preempted_by is not None:
        return []
    if now < gang.scheduled.occurred_at + timedelta(seconds=deadline_s):
        return []
    settled = gang.started | gang.failed | set(gang.completed) | set(gang.preempted)
    return [p for p in gang.scheduled.placements if not p.spare and p.shard_index not in settled]


def start_timeout(gang: Gang, shard: ShardPlacement, *, term: int, deadline_s: float, now: datetime) -> list[Event]:
    """Revoke an overdue shard and report it failed ``START_TIMEOUT``."""
    attempt = gang.scheduled.attempt
    message = f"not reported started within {deadline_s:g}s of its assignment (attempt {attempt}): revoked"
    return revoked_failure(
        gang, shard, FailureCause.START_TIMEOUT, message, term=term, now=now, revoked=RevocationReason.START_TIMEOUT
    )


def timed_out(gangs: Iterable[Gang], *, deadline_s: float, term: int, now: datetime) -> list[Event]:
    """Revoke every overdue shard of ``gangs`` and report it failed ``START_TIMEOUT``."""
    out: list[Event] = []
    for gang in gangs:
        for shard in overdue(gang, now, deadline_s):
            out.extend(start_timeout(gang, shard, term=term, deadline_s=deadline_s, now=now))
    return out


def revoked_failure(
    gang: Gang,
    shard: ShardPlacement,
    cause: FailureCause,
    message: str,
    *,
    term: int,
    now: datetime,
    revoked: RevocationReason,
) -> list[Event]:
    """Revoke one shard (its agent stops it should it run after all; the pool frees its GPUs) and report it failed
    with ``cause`` on its agent's behalf, so the fault manager recovers the gang by the usual rules."""
    return [
        revocation(gang, shard, revoked, f"{REVOKED_AS[revoked]}: {message}", term=term, now=now),
        ShardFailed(
            occurred_at=now,
            job_id=gang.spec.job_id,
            shard_index=shard.shard_index,
            attempt=gang.scheduled.attempt,
            node_id=shard.node_id,
            cause=cause,
            exit_code=None,
            message=message,
        ),
    ]
