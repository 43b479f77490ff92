"""Re-forming a recovering gang where it stands, without waiting for a cycle. Pure: time comes in.

When the fault manager's plan for a failed attempt applies at once (no backoff), the gang keeps the GPUs of its
surviving training shards: their nodes hold the job's warm standbys and its data. The lost shards take the gang's
spares when it holds enough on usable nodes (ALIVE, not excluded); else they are placed alone, by the same rules as
any placement, on the cluster as it was before the failed attempt let go of its GPUs, so they land off the gang's own.
When neither works the job stays requeued and a cycle places it afresh (no preemption is made for a re-forming gang).
"""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from shardyard.events import NodeState, NodeStatus, ShardPlacement
from shardyard.placement.cycle import schedule
from shardyard.placement.gang_placement import COORDINATOR_TIE, coordinator_source
from shardyard.placement.model import NodeView, PendingJob, Place, Policy, Snapshot
from shardyard.scheduler.gang import Gang
from shardyard.topology import estimated_rtt_ms


@dataclass(frozen=True)
class Ground:
    """The cluster a gang re-forms on."""

    nodes: Mapping[str, NodeState]
    """The nodes' states: a shard survives on an ALIVE node only."""
    before: Snapshot
    """The cluster with the failed attempt's GPUs still taken: lost shards placed on it go elsewhere."""
    views: Mapping[str, NodeView]
    """The nodes' views now, by node id (the failed attempt's GPUs and port free): the re-formed gang's hosts."""
    free_port: Callable[[NodeView], int | None]
    """A rendezvous port the job's next attempt may take on a node, if any."""
    policy: Policy


@dataclass(frozen=True)
class Survivors:
    training: list[ShardPlacement]
    """The gang's training shards on usable nodes (ALIVE, not excluded)."""
    spares: list[ShardPlacement]
    """Its spares on usable nodes."""
    lost: int
    """How many training shards were lost."""


def reform(gang: Gang, excluded: frozenset[str], ground: Ground, now: datetime) -> Place | None:
    """The gang re-formed off the ``excluded`` nodes: spares promoted, else the lost shards placed alone; None when
    neither fits now."""
    kept = survivors(gang, excluded, ground.nodes)
    return promote(gang, kept, ground) or place_lost(gang, kept, excluded, ground, now)


def survivors(gang: Gang, excluded: frozenset[str], nodes: Mapping[str, NodeState]) -> Survivors:
    def usable(shard: ShardPlacement) -> bool:
        node = nodes.get(shard.node_id)
        return shard.node_id not in excluded and node is not None and node.status is NodeStatus.ALIVE

    training = [p for p in gang.scheduled.placements if not p.spare]
    kept = [p for p in training if usable(p)]
    spares = [p for p in gang.scheduled.placements if p.spare and usable(p)]
    return Survivors(kept, spares, len(training) - len(kept))


def promote(gang: Gang, kept: Survivors, ground: Ground) -> Place | None:
    """The lost shards' places taken by spares (the first ones), when the gang holds enough usable spares."""
    if kept.lost == 0 or len(kept.spares) < kept.lost:
        return None
    return regroup(gang, [*kept.training, *kept.spares[: kept.lost]], kept.spares[kept.lost :], ground)


def place_lost(gang: Gang, kept: Survivors, excluded: frozenset[str], ground: Ground, now: datetime) -> Place | None:
    """The lost shards placed alone, as a gang of their own, on ``ground.before``; the usable spares stay spares.
    None when they do not fit now."""
    if kept.lost == 0:
        return regroup(gang, kept.training, kept.spares, ground)
    spec = gang.spec.model_copy(update={"shard_count": kept.lost})
    alone = PendingJob(spec, now, excluded_nodes=excluded)
    decisions = schedule(ground.before, [alone], ground.policy, now=now)
    found = next((d for d in decisions if isinstance(d, Place) and d.job_id == spec.job_id), None)
    if found is None:
        return None
    return regroup(gang, [*kept.training, *(p for p in found.placements if not p.spare)], kept.spares, ground)


def regroup(gang: Gang, members: list[ShardPlacement], spares: list[ShardPlacement], ground: Ground) -> Place | None:
    """The re-formed gang: ``members`` train (indices 0..), ``spares`` follow. None when a member's node has no
    view (it went away) or no member's node has a rendezvous port free."""
    placements = [
        *(p.model_copy(update={"shard_index": i, "spare": False}) for i, p in enumerate(members)),
        *(p.model_copy(update={"shard_index": len(members) + i, "spare": True}) for i, p in enumerate(spares)),
    ]
    hosts = [ground.views[p.node_id] for p in members if p.node_id in ground.views]
    if len(hosts) < len(members):
        return None
    # The coordinator: the member with the lowest total RTT to the others (measured where known) that has a free
    # rendezvous port; near-ties go to the node best connected to all its measured peers (as ``coordinator_of``).
    rtt, mean = ground.before.rtt_ms, ground.before.mean_rtt_ms
    distinct = list({view.node_id: view for view in hosts}.values())
    cost = {v.node_id: sum(estimated_rtt_ms(v, other, rtt) for other in hosts) for v in distinct}
    lowest = min(cost.values())
    ranked = sorted(
        distinct,
        key=lambda v: (
            cost[v.node_id] > lowest * (1 + COORDINATOR_TIE) + 1e-9,
            mean.get(v.node_id, math.inf),
            cost[v.node_id],
        ),
    )
    degraded = any(p.degraded for p in placements if not p.spare)
    for view in ranked:
        if ground.free_port(view) is not None:
            source = coordinator_source(view.node_id, cost, rtt)
            return Place(gang.spec.job_id, tuple(placements), view.node_id, degraded, source)
    return None
