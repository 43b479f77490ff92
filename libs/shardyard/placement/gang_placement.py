"""Placing one gang on the cycle's index: walk nodes in rank order (match, load step, locality, fragmentation), pick
the members (mutual latency breaks ties), the coordinator (lowest mean RTT, a free rendezvous port) and the spares.
Pure."""

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache

from shardyard.events import ShardPlacement
from shardyard.events.job import CoordinatorSource
from shardyard.gpus import match_score
from shardyard.placement.candidate import Candidate
from shardyard.placement.filters import bucket_failing, full_match, gang_failing, node_failing
from shardyard.placement.index import ClusterIndex, Group, Slot
from shardyard.placement.model import Place
from shardyard.topology import estimated_rtt_ms

COORDINATOR_TIE = 0.1
"""Coordinator costs within this fraction of the lowest count as tied (measurement noise)."""
RankKey = tuple[float, int, int, int]
"""(-match, load step, -locality, fragmentation rank): smaller is better."""


@cache
def frag_order(k: int, max_free: int) -> tuple[int, ...]:
    """The free-GPU counts that pass the bucket filters, in fragmentation order: nodes that take the most shards
    first, best fit among them. (The bucket filters read no job, so each (k, max_free) is worked out once.)"""
    order = (*range(k, max_free + 1), *range(min(k - 1, max_free), -1, -1))
    return tuple(free for free in order if bucket_failing(free) is None)


def walk(index: ClusterIndex, job: Candidate) -> Iterator[tuple[RankKey, Slot, int]]:
    """Nodes that pass every bucket and node filter for ``job``, best ranked first: (rank key, slot, shards it can
    take). The state and group filters are passed already: the index files only the nodes that pass the state ones,
    and ``job.eligible`` holds only the groups that pass the group ones."""
    tiers: dict[float, list[Group]] = {}
    for key, match in job.eligible.items():
        tiers.setdefault(match, []).append(index.groups[key])
    fcs = frag_order(job.k, index.max_free)
    frag_rank = {fc: rank for rank, fc in enumerate(fcs)}
    for match in sorted(tiers, reverse=True):
        groups = tiers[match]
        for step in range(index.load_steps):
            # Locality first within the tier: nodes holding the job's model or dataset on local disk (the index
            # lists only those that can take a shard). At most k + latency_window of them are weighed, so the cost
            # stays flat when an artifact is cached widely.
            seen: set[Slot] = set()
            local: list[tuple[int, int, tuple[float, str], Slot]] = []
            room = job.k + index.policy.latency_window
            for group in groups:
                for path in (job.model_path, job.dataset_path):
                    for slot in index.local_nodes(path, group, step):
                        if len(local) >= room:
                            break
                        rank = frag_rank.get(len(slot.free))
                        if slot in seen or rank is None:
                            continue
                        seen.add(slot)
                        local.append((-slot.locality(job.model_path, job.dataset_path), rank, slot.order, slot))
            for neg_loc, rank, _order, slot in sorted(local):
                if node_failing(slot, job) is None:
                    yield (-match, step, neg_loc, rank), slot, slot.capacity(job)
            for fc in fcs:
                rank = frag_rank[fc]
                for group in groups:
                    bucket = group.buckets.get((step, fc))
                    if bucket is None or not bucket.count:
                        continue
                    for slot in bucket.members():
                        if (seen and slot in seen) or node_failing(slot, job) is not None:
                            continue
                        yield (-match, step, 0, rank), slot, slot.capacity(job)


@dataclass(frozen=True)
class Links:
    """What the cycle knows of the network: measured RTTs (either order; labels estimate the rest), each node's
    mean measured RTT, the nodes with slow links, and whether to weigh latency at all."""

    rtt: Mapping[tuple[str, str], float] = field(default_factory=dict)
    mean: Mapping[str, float] = field(default_factory=dict)
    slow: frozenset[str] = frozenset()
    topology: bool = False
    degraded: frozenset[str] = frozenset()
    """Nodes that rank last: passed over while the gang fits without them (``Snapshot.degraded``)."""


def place_gang(index: ClusterIndex, job: Candidate, links: Links) -> Place | None:
    """Place ``job``'s gang whole on the best-ranked nodes, or nothing (None) when the gang filters fail. A gang
    spread over several nodes is placed off the nodes with slow links when it fits without them; every gang off the
    degraded nodes likewise."""
    keys, members = gather(index, job, links.topology, links.slow, links.degraded)
    if (links.slow or links.degraded) and gang_failing(members, job) is not None:
        keys, members = gather(index, job, links.topology, frozenset(), frozenset())
    if gang_failing(members, job) is not None:
        return None
    rtt = links.rtt
    chosen = choose_by_latency(keys, members, job.k, rtt) if links.topology else choose_in_order(members, job.k)
    coordinator = coordinator_of(chosen, links)
    if coordinator is None:  # none of the chosen has a free port: the best-ranked member with one joins the gang
        chosen = choose_in_order(with_a_port_first(members), job.k)
        coordinator = coordinator_of(chosen, links)
    if coordinator is None:
        return None
    placements: list[ShardPlacement] = []
    degraded = False
    for slot, take in chosen:
        gpus = slot.free[:take]
        score = round(match_score(slot.group.tflops, job.spec.min_tflops), 4)
        below = degraded_on(slot, job)
        degraded = degraded or below
        for gpu in gpus:
            placements.append(
                ShardPlacement(
                    shard_index=len(placements),
                    node_id=slot.node_id,
                    gpu_indices=(gpu,),
                    gpu_model=slot.gpu_model,
                    match_score=score,
                    degraded=below,
                )
            )
        index.take(slot, gpus, job.spec, coordinator=slot is coordinator)
    if job.pending.spares:
        placements.extend(place_spares(index, job, {slot.node_id for slot, _ in chosen}, len(placements)))
    source = coordinator_source(coordinator.node_id, (slot.node_id for slot, _ in chosen), rtt)
    return Place(job.spec.job_id, tuple(placements), coordinator.node_id, degraded, source)


def degraded_on(slot: Slot, job: Candidate) -> bool:
    """Whether a shard of ``job`` on ``slot`` runs degraded: only a degraded job may be placed off the full-match
    groups (the others place only on groups that passed the full-match filters)."""
    return job.degraded and not full_match(slot.group, job)


def gather(
    index: ClusterIndex, job: Candidate, topology: bool, avoid: frozenset[str], degraded: frozenset[str] = frozenset()
) -> tuple[list[RankKey], list[tuple[Slot, int]]]:
    """The walk's nodes until they hold the gang, plus (with topology) up to ``latency_window`` more of the last
    rank to weigh mutual latency among: their rank keys, and each node with the shards it can take. A node in
    ``avoid`` is passed over unless it alone takes the whole gang (its links are then not used); one in
    ``degraded`` always."""
    k = job.k
    keys: list[RankKey] = []
    members: list[tuple[Slot, int]] = []
    total = 0
    boundary: RankKey | None = None
    extra = 0
    coordinates = False  # whether a member so far has a free rendezvous port: the gang needs one to meet
    for key, slot, capacity in walk(index, job):
        if avoid and slot.node_id in avoid and (members or capacity < k or not slot.ports):
            continue
        if degraded and slot.node_id in degraded:
            continue
        if total >= k and coordinates:
            if not topology or key != boundary or extra >= index.policy.latency_window:
                break
            extra += 1
        else:
            total += capacity
            boundary = key
        keys.append(key)
        members.append((slot, capacity))
        coordinates = coordinates or bool(slot.ports)
        if len(members) == 1 and capacity >= k and coordinates:
            break  # the best-ranked node takes the whole gang: no mutual latency to weigh
    return keys, members


def with_a_port_first(members: list[tuple[Slot, int]]) -> list[tuple[Slot, int]]:
    """``members`` in rank order, but the best-ranked one with a free rendezvous port first."""
    first = next((i for i, (slot, _capacity) in enumerate(members) if slot.ports), None)
    return members if first is None else [members[first], *members[:first], *members[first + 1 :]]


def choose_by_latency(
    keys: list[RankKey], members: list[tuple[Slot, int]], k: int, rtt: Mapping[tuple[str, str], float]
) -> list[tuple[Slot, int]]:
    """Members in rank order, ties broken by the least RTT to the members chosen so far: (slot, shards)."""
    chosen: list[tuple[Slot, int]] = []
    remaining = k
    rtt_sum = [0.0] * len(members)
    left = list(range(len(members)))
    while remaining > 0:
        best = min(left, key=lambda i: (keys[i], rtt_sum[i], members[i][0].order))
        left.remove(best)
        slot, capacity = members[best]
        take = min(capacity, remaining)
        chosen.append((slot, take))
        remaining -= take
        for i in left if remaining > 0 else ():
            rtt_sum[i] += estimated_rtt_ms(members[i][0], slot, rtt)
    return chosen


def choose_in_order(members: list[tuple[Slot, int]], k: int) -> list[tuple[Slot, int]]:
    """Members in rank order until they hold the gang: (slot, shards)."""
    chosen: list[tuple[Slot, int]] = []
    remaining = k
    for slot, capacity in members:
        take = min(capacity, remaining)
        chosen.append((slot, take))
        remaining -= take
        if remaining == 0:
            break
    return chosen


def place_spares(index: ClusterIndex, job: Candidate, gang_nodes: set[str], first_index: int) -> list[ShardPlacement]:
    """Up to ``job.pending.spares`` spare GPUs, one per node and off the gang's nodes first (a spare must survive
    the loss of a gang node); on the gang's nodes only when nothing else is free."""
    wanted = job.pending.spares
    picked: list[tuple[Slot, int]] = []
    used: set[str] = set()
    for _key, slot, _capacity in walk(index, job):
        if len(picked) == wanted:
            break
        if slot.node_id not in gang_nodes and slot.node_id not in used:
            picked.append((slot, slot.free[0]))
            used.add(slot.node_id)
    for node_id in sorted(gang_nodes) if len(picked) < wanted else ():
        slot = index.slots[node_id]
        for gpu in slot.free[: slot.capacity(job)]:
            if len(picked) < wanted:
                picked.append((slot, gpu))
    out: list[ShardPlacement] = []
    for slot, gpu in picked:
        index.take(slot, [gpu], job.spec, coordinator=False)
        out.append(
            ShardPlacement(
                shard_index=first_index + len(out),
                node_id=slot.node_id,
                gpu_indices=(gpu,),
                gpu_model=slot.gpu_model,
                match_score=round(match_score(slot.group.tflops, job.spec.min_tflops), 4),
                degraded=degraded_on(slot, job),
                spare=True,
            )
        )
    return out


def coordinator_of(chosen: list[tuple[Slot, int]], links: Links) -> Slot | None:
    """The member with the lowest mean RTT to the other shards (S10); it must have a free rendezvous port. Members
    within ``COORDINATOR_TIE`` of each other (two nodes have one link, the same both ways) are told apart by their
    mean measured RTT to all their measured peers: the better-connected node coordinates."""
    costs: list[tuple[float, float, int, Slot]] = []
    for order, (slot, _take) in enumerate(chosen):
        if slot.ports:
            cost = sum(estimated_rtt_ms(slot, other, links.rtt) * n for other, n in chosen if other is not slot)
            costs.append((cost, links.mean.get(slot.node_id, math.inf), order, slot))
    if not costs:
        return None
    lowest = min(cost for cost, *_ in costs)
    tied = [entry for entry in costs if entry[0] <= lowest * (1 + COORDINATOR_TIE) + 1e-9]
    return min(tied, key=lambda entry: (entry[1], entry[0], entry[2]))[3]


def coordinator_source(
    coordinator: str, members: Iterable[str], rtt: Mapping[tuple[str, str], float]
) -> CoordinatorSource:
    """What the coordinator was chosen on: its measured links to the other members, labels, or a mix of both."""
    others = {node for node in members if node != coordinator}
    if not others:
        return "single-node"
    measured = sum(1 for other in others if (coordinator, other) in rtt or (other, coordinator) in rtt)
    return "measured" if measured == len(others) else "mixed" if measured else "topology"
