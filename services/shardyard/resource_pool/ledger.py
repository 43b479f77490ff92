"""The reservations ledger: the GPUs each shard assignment holds on its node, and when it lets them go. Pure: time
comes in.

A ``ShardAssignment`` reserves its GPUs, unless its term is older than the newest assignment's (a deposed leader's)
or its placement is stale for its job (below). A reservation is released when:

- its shard ends: revoked, completed, failed, stopped on request;
- its attempt ends: the job's end, its preemption, its recovery plan (``JobRecovering``: the failed attempt's shards
  are revoked, and whatever the next attempt keeps, it reserves again under its own number);
- a newer placement of its job supersedes it (``JobScheduled``, fenced by term job by job as the scheduler fences it,
  see ``shardyard.scheduler.fencing``): a later attempt under the same term, or any placement under a newer term. A
  deposed leader's placement that lands after the newer one reserves nothing;
- it is **orphaned**: no agent runs it. A training shard's reservation that its node's full heartbeats (they list the
  shards the agent runs, and go out whenever that set changes and on a slow refresh, every 10 s by default) have left
  out for longer than ``grace_s``, counted from no earlier than ``start_deadline_s`` after its assignment (the
  scheduler's start deadline comes first: it revokes the shard and fails it, so the job is recovered), is dropped.
  A heartbeat that lists it again resets the count. Spares are never orphaned (they run nothing until promoted, as a
  new attempt), nor reservations on a node that is not ALIVE (node loss releases those).

The orphan rule is the backstop that keeps GPUs from staying reserved for nothing whatever went missing: revocations
a deposed leader decided and never published, an assignment its agent never took, an agent restarted without its
shards. It costs what changes: each full heartbeat compares its node's reservations, and a check reads only the
reservations left out.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shardyard.events import (
    JobCancelled,
    JobFailed,
    JobPreempted,
    JobRecovering,
    JobResized,
    JobScheduled,
    JobSucceeded,
    ShardAssignment,
    ShardCompleted,
    ShardFailed,
    ShardPreempted,
    ShardRevocation,
)

Key = tuple[str, int, int]
"""(job, shard index, attempt): how an agent names what it runs."""


@dataclass
class Reservation:
    gpus: tuple[int, ...]
    term: int
    spare: bool
    since: datetime
    """When it was assigned (the assignment's time)."""
    unlisted_at: datetime | None = None
    """When a full heartbeat of its node first left it out (since the last that listed it); None: not left out."""


def superseded(term: int, attempt: int, newest: tuple[int, int]) -> bool:
    """Whether an assignment or placement (``term``, ``attempt``) is older than a job's ``newest`` placement: an
    older leader's, or an earlier attempt of the same leader."""
    newest_term, newest_attempt = newest
    return term < newest_term or (term == newest_term and attempt < newest_attempt)


@dataclass
class Ledger:
    start_deadline_s: float = 60.0
    grace_s: float = 30.0
    by_node: dict[str, dict[Key, Reservation]] = field(default_factory=dict)
    max_term: int = 0
    """The newest scheduler term seen on an assignment: assignments of older terms (a deposed leader's) are
    refused, so they reserve nothing."""
    jobs_on: dict[str, set[str]] = field(default_factory=dict)
    """Job -> the nodes its assignments reserved GPUs on (a job's end releases those, not every node's ledger)."""
    placed: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Job -> (term, attempt) of its newest placement read."""
    unlisted: dict[tuple[str, Key], None] = field(default_factory=dict)
    """(node, key) of the reservations a full heartbeat left out: what an orphan check reads."""

    def gpus_of(self, node_id: str) -> tuple[int, ...]:
        return tuple(sorted({g for r in self.by_node.get(node_id, {}).values() for g in r.gpus}))

    def apply(self, event: object) -> set[str]:
        """Reserve or release GPUs; the nodes whose reservations changed."""
        match event:
            case ShardAssignment() if event.term >= self.max_term:
                self.max_term = event.term
                newest = self.placed.get(event.job_id)
                if newest is not None and superseded(event.term, event.attempt, newest):
                    return set()  # a stale placement's: its job was placed anew since
                key = (event.job_id, event.shard_index, event.attempt)
                self.unlisted.pop((event.node_id, key), None)  # a redelivery counts afresh
                self.by_node.setdefault(event.node_id, {})[key] = Reservation(
                    event.gpu_indices, event.term, event.spare, event.occurred_at
                )
                self.jobs_on.setdefault(event.job_id, set()).add(event.node_id)
                return {event.node_id}
            case ShardRevocation() | ShardCompleted() | ShardFailed() | ShardPreempted():
                return self._drop(event.node_id, (event.job_id, event.shard_index, event.attempt))
            case JobScheduled():
                newest = self.placed.get(event.job_id)
                if newest is not None and superseded(event.term, event.attempt, newest):
                    return set()  # fenced: a deposed leader's placement, or an older attempt
                self.placed[event.job_id] = newest = (event.term, event.attempt)
                return self._release(event.job_id, lambda r, key: superseded(r.term, key[2], newest))
            case JobRecovering() | JobPreempted() | JobResized():
                # The attempt is over; later attempts are not placed yet when this is read, or reserve anew.
                last = event.attempt
                return self._release(event.job_id, lambda _r, key: key[2] <= last)
            case JobSucceeded() | JobFailed() | JobCancelled():
                changed = self._release(event.job_id, lambda _r, _key: True)
                self.jobs_on.pop(event.job_id, None)
                self.placed.pop(event.job_id, None)
                return changed
            case _:
                return set()

    def drop_node(self, node_id: str) -> None:
        """The node is LOST: everything it held is released."""
        for key in self.by_node.pop(node_id, {}):
            self.unlisted.pop((node_id, key), None)

    def reported(self, node_id: str, running: Iterable[Key], now: datetime) -> None:
        """A full heartbeat of ``node_id`` (received ``now``) lists ``running``: the node's reservations it leaves
        out start (or keep) counting towards orphanhood; those it lists stop."""
        ledger = self.by_node.get(node_id)
        if not ledger:
            return
        listed = set(running)
        for key, reservation in ledger.items():
            if key in listed:
                reservation.unlisted_at = None
                self.unlisted.pop((node_id, key), None)
            elif reservation.unlisted_at is None and not reservation.spare:
                reservation.unlisted_at = now
                self.unlisted[(node_id, key)] = None

    def orphans(self, now: datetime, alive: Callable[[str], bool]) -> list[tuple[str, Key]]:
        """The reservations orphaned at ``now``: left out, past the start deadline, for longer than the grace, on a
        node ``alive`` says is ALIVE."""
        grace = timedelta(seconds=self.grace_s)
        deadline = timedelta(seconds=self.start_deadline_s)
        out: list[tuple[str, Key]] = []
        for node_id, key in self.unlisted:
            reservation = self.by_node.get(node_id, {}).get(key)
            if reservation is None or reservation.unlisted_at is None:
                continue
            since = max(reservation.unlisted_at, reservation.since + deadline)
            if now - since > grace and alive(node_id):
                out.append((node_id, key))
        return out

    def release_orphans(self, now: datetime, alive: Callable[[str], bool]) -> set[str]:
        """Drop the orphaned reservations (see ``orphans``); the nodes whose reservations changed."""
        changed: set[str] = set()
        for node_id, key in self.orphans(now, alive):
            changed |= self._drop(node_id, key)
        return changed

    def _drop(self, node_id: str, key: Key) -> set[str]:
        if self.by_node.get(node_id, {}).pop(key, None) is None:
            return set()
        self.unlisted.pop((node_id, key), None)
        return {node_id}

    def _release(self, job_id: str, which: Callable[[Reservation, Key], bool]) -> set[str]:
        changed: set[str] = set()
        for node_id in self.jobs_on.get(job_id, ()):
            ledger = self.by_node.get(node_id, {})
            for key in [k for k, r in ledger.items() if k[0] == job_id and which(r, k)]:
                changed |= self._drop(node_id, key)
        return changed
