"""Fencing placements by leader term, job by job. Pure.

A deposed leader can still land a placement (``JobScheduled``) after the next leader took over: its send was in
flight, or its process stalled with it in its producer, when its lease ran out; the next leader, which read the log to
its end before deciding, never saw it and may have placed the same job itself. Nothing stops such a record from
landing, so every reader judges it by the same rule, on the job's placements in log order (the lifecycle topic is
keyed by job, so they all read one job's placements in one order):

- **stale**: a placement under a lower term than the job's newest one (a deposed leader's), or an older attempt under
  the same term (a late duplicate). It changes nothing: the job keeps its placement; the leader revokes whatever the
  stale one assigned (``stale_revocations``).
- **new**: a placement under a higher term than the job's newest one supersedes the job's current placement, whatever
  its attempt number (a newer leader placed the job without having read the older one; the older one is revoked), and
  a newer attempt under the same term is the job's next placement.
- **echo**: the job's current placement again (a leader applies its own before it reads it back from the log).
- **ended**: the job's newest attempt again, after it ended (recovery or preemption requeued the job).

The leader applies its own placement before the log has it, so its order and the log's differ only for placements it
had not read yet; the rule gives the same outcome either way (whichever of two placements has the higher term wins).

Attempt numbers: a new placement takes a number above every attempt of the job seen placed, stale ones included, so
a leader never places an attempt again once it has read that attempt placed (by anyone, under any term).
"""

from datetime import datetime
from enum import StrEnum

from shardyard.events import JobScheduled, ShardRevocation


class Verdict(StrEnum):
    NEW = "NEW"
    ECHO = "ECHO"
    ENDED = "ENDED"
    STALE = "STALE"


def judge(event: JobScheduled, newest: tuple[int, int] | None, current: JobScheduled | None) -> Verdict:
    """The verdict on placement ``event`` of a job whose newest placement read so far was ``newest`` (term, attempt),
    or none; ``current`` is the job's placement in force (None once that attempt ended)."""
    if newest is None:
        return Verdict.NEW
    term, attempt = newest
    if event.term != term:
        return Verdict.NEW if event.term > term else Verdict.STALE
    if event.attempt != attempt:
        return Verdict.NEW if event.attempt > attempt else Verdict.STALE
    if current is not None and (current.term, current.attempt) == newest:
        return Verdict.ECHO
    return Verdict.ENDED


def stale_revocations(
    stale: JobScheduled, current: JobScheduled | None, *, term: int, now: datetime
) -> list[ShardRevocation]:
    """Revoke every shard (spares too) that the stale placement assigned, except those that are, by their key on
    their node, shards of the job's current placement too (same node, index and attempt: its agent runs one process
    for the key, the current placement's)."""
    keep: set[tuple[str, int]] = set()
    if current is not None and current.attempt == stale.attempt:
        keep = {(p.node_id, p.shard_index) for p in current.placements}
    reason = f"placement of attempt {stale.attempt} under term {stale.term} is fenced: term {term} leads"
    return [
        ShardRevocation(
            occurred_at=now,
            job_id=stale.job_id,
            shard_index=shard.shard_index,
            node_id=shard.node_id,
            attempt=stale.attempt,
            term=term,
            reason=reason,
        )
        for shard in stale.placements
        if (shard.node_id, shard.shard_index) not in keep
    ]
