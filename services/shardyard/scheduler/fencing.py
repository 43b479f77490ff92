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

``Fence`` keeps what the rule reads, as the book takes placements in: each job's newest placement, the highest attempt
seen placed, and the stale placements the leader has yet to revoke.
"""

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from shardyard.events import JobScheduled, RevocationReason, ShardRevocation


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


@dataclass
class Fence:
    """The placements read so far, job by job, in log order: what the rule judges the next one by."""

    placed: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Job -> (term, attempt) of its newest placement."""
    numbered: dict[str, int] = field(default_factory=dict)
    """Job -> the highest attempt seen placed, stale placements included: its next placement takes a higher one."""
    stale: list[JobScheduled] = field(default_factory=list)
    """Fenced or superseded placements whose shards the leader has yet to revoke."""

    def take(self, event: JobScheduled, current: JobScheduled | None, *, ended: bool) -> bool:
        """Judge placement ``event``; ``current`` is the job's placement in force (None: none), ``ended`` whether the
        job ended (its placements are then only numbered). True when ``event`` becomes the job's placement in force:
        ``current`` is then superseded, and kept to revoke."""
        job_id = event.job_id
        self.numbered[job_id] = max(self.numbered.get(job_id, 0), event.attempt)
        if ended:
            return False
        verdict = judge(event, self.placed.get(job_id), current)
        if verdict is Verdict.STALE:
            self.stale.append(event)
            return False
        if verdict is not Verdict.NEW:
            return False  # the echo of our own placement, or that attempt already ended (the job was requeued)
        if current is not None:
            self.stale.append(current)  # superseded by a newer leader's placement of the job
        self.placed[job_id] = (event.term, event.attempt)
        return True

    def attempt(self, job_id: str) -> int:
        """The attempt of the job's newest placement (in force, or ended); 0 before any."""
        return self.placed.get(job_id, (0, 0))[1]

    def next_attempt(self, job_id: str) -> int:
        """The attempt the job's next placement takes: never one seen placed, under any term."""
        return self.numbered.get(job_id, 0) + 1

    def take_stale(self) -> list[JobScheduled]:
        """The stale placements to revoke, handed over once."""
        stale, self.stale = self.stale, []
        return stale


def stale_revocations(
    stale: JobScheduled, current: JobScheduled | None, *, term: int, now: datetime
) -> list[ShardRevocation]:
    """Revoke every shard (spares too) that the stale placement assigned, except those that are, by their key on
    their node, shards of the job's current placement too (same node, index and attempt: its agent runs one process
    for the key, the current placement's)."""
    keep: set[tuple[str, int]] = set()
    if current is not None and current.attempt == stale.attempt:
        keep = {(p.node_id, p.shard_index) for p in current.placements}
    message = f"placement of attempt {stale.attempt} under term {stale.term} is fenced: term {term} leads"
    return [
        ShardRevocation(
            occurred_at=now,
            job_id=stale.job_id,
            shard_index=shard.shard_index,
            node_id=shard.node_id,
            attempt=stale.attempt,
            term=term,
            reason=RevocationReason.STALE_PLACEMENT,
            message=message,
        )
        for shard in stale.placements
        if (shard.node_id, shard.shard_index) not in keep
    ]
