"""Orphaned shards: no GPU stays reserved for a shard that nothing runs. Pure: time comes in.

A training shard of a gang's current attempt holds its GPUs until its end is reported. When its node's agent forgot
it (the agent restarted), or its process vanished without a report, no end ever comes and nothing fails it: the
node stays ALIVE, so neither the start deadline (the shard may have been reported started) nor node loss applies.
The node's state says so, though: it carries the shards its agent reports running (the agent's full heartbeat, sent
whenever that set changes and on its slow refresh, every 10 s by default).

A shard is orphaned once, past its start deadline, every state of its ALIVE node that the leader checked against
for longer than ``grace_s`` left it out. The grace runs from the first check (a cycle; at most one a second) that
found it missing, and a state that lists it again resets it: it covers a full heartbeat still on its way (a shard
just started) and the resource pool's publication. The scheduler then revokes it and reports it failed ``ORPHANED``
on the agent's behalf (the start deadline's path), so the fault manager recovers the gang by the usual rules and the
pool frees its GPUs.

Never orphaned: spares (they run nothing until promoted), shards reported ended (completed, failed, stopped on
request), shards of a gang being preempted (the preemption has a deadline of its own), and shards on a node that is
not ALIVE (node loss decides those).
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from shardyard.events import Event, FailureCause, NodeState, NodeStatus, RevocationReason, ShardPlacement
from shardyard.scheduler.gang import Gang
from shardyard.scheduler.start_deadline import revoked_failure

ShardKey = tuple[str, int, int]
"""(job, shard index, attempt): how an agent names what it runs."""


def running_keys(state: NodeState) -> frozenset[ShardKey]:
    return frozenset((r.job_id, r.shard_index, r.attempt) for r in state.running)


def orphaned(
    gang: Gang,
    nodes: Mapping[str, NodeState],
    running: Mapping[str, frozenset[ShardKey]],
    now: datetime,
    *,
    deadline_s: float,
    grace_s: float,
) -> list[ShardPlacement]:
    """The training shards of ``gang`` that are orphaned at ``now``; records (``gang.unlisted``) when each shard was
    first found missing from its node's running shards. O(1) for a gang within its start deadline or being
    preempted; else O(shards)."""
    if gang.preempted_by is not None or now < gang.scheduled.occurred_at + timedelta(seconds=deadline_s):
        return []
    ended = gang.failed | set(gang.completed) | set(gang.preempted)
    attempt = gang.scheduled.attempt
    out: list[ShardPlacement] = []
    for shard in gang.scheduled.placements:
        if shard.spare or shard.shard_index in ended:
            continue
        node = nodes.get(shard.node_id)
        if node is None or node.status is not NodeStatus.ALIVE:
            continue
        if (gang.spec.job_id, shard.shard_index, attempt) in running.get(shard.node_id, frozenset()):
            gang.unlisted.pop(shard.shard_index, None)
            continue
        since = gang.unlisted.setdefault(shard.shard_index, now)
        if (now - since).total_seconds() > grace_s:
            out.append(shard)
    return out


def orphan_failure(gang: Gang, shard: ShardPlacement, *, term: int, grace_s: float, now: datetime) -> list[Event]:
    """Revoke an orphaned shard and report it failed ``ORPHANED``."""
    since = gang.unlisted.get(shard.shard_index, now)
    missing_s = (now - since).total_seconds()
    message = (
        f"node {shard.node_id} has not reported the shard running for {missing_s:.0f}s (grace {grace_s:g}s), "
        f"past its start deadline (attempt {gang.scheduled.attempt}): revoked, its GPUs freed"
    )
    return revoked_failure(
        gang, shard, FailureCause.ORPHANED, message, term=term, now=now, revoked=RevocationReason.ORPHANED
    )


@dataclass
class OrphanCheck:
    """The leader's look for orphans, at most every ``every_s``: a check reads every placed shard, and cycles come
    per batch of facts."""

    every_s: float = 1.0
    checked_at: datetime | None = None

    def run(
        self,
        gangs: Iterable[Gang],
        nodes: Mapping[str, NodeState],
        running: Mapping[str, frozenset[ShardKey]],
        now: datetime,
        *,
        deadline_s: float,
        grace_s: float,
        term: int,
    ) -> list[Event]:
        """Revoke every orphaned shard of ``gangs`` and report it failed; nothing when the last check is too recent."""
        if self.checked_at is not None and (now - self.checked_at).total_seconds() < self.every_s:
            return []
        self.checked_at = now
        out: list[Event] = []
        for gang in gangs:
            for shard in orphaned(gang, nodes, running, now, deadline_s=deadline_s, grace_s=grace_s):
                out.extend(orphan_failure(gang, shard, term=term, grace_s=grace_s, now=now))
        return out
