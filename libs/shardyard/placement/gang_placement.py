"""Placing one gang on the cycle's index: walk nodes in rank order (match, load step, locality, fragmentation), pick
the members (mutual latency breaks ties), the coordinator (lowest mean RTT, a free rendezvous port) and the spares.
Pure."""

from collections.abc import Iterator

from shardyard.events import ShardPlacement
from shardyard.gpus import match_score
from shardyard.placement.candidate import Candidate
from shardyard.placement.index import ClusterIndex, Group, Slot
from shardyard.placement.model import Place
from shardyard.topology import estimated_rtt_ms


def frag_order(k: int, max_free: int) -> list[int]:
    """Free-GPU counts in fragmentation order: nodes that take the most shards first, best fit among them."""
    return [*range(k, max_free + 1), *range(min(k - 1, max_free), 0, -1)]


def walk(index: ClusterIndex, job: Candidate) -> Iterator[tuple[tuple[float, int, int, int], Slot, int]]:
    """Nodes that can take shards of ``job``, best ranked first: (rank key, slot, shards it can take)."""
    tiers: dict[float, list[Group]] = {}
    for key, match in job.eligible.items():
        tiers.setdefault(match, []).append(index.groups[key])
    fcs = frag_order(job.k, index.max_free)
    frag_rank = {fc: rank for rank, fc in enumerate(fcs)}
    excluded = job.excluded
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
                        if slot in seen:
                            continue
                        seen.add(slot)
                        loc = slot.locality(job.model_path, job.dataset_path)
                        local.append((-loc, frag_rank.get(len(slot.free), len(fcs)), slot.order, slot))
            for neg_loc, rank, _order, slot in sorted(local):
                if (excluded and slot.node_id in excluded) or not slot.has_artifacts(job.model_path, job.dataset_path):
                    continue
                capacity = slot.capacity(job.spec)
                if capacity > 0:
                    yield (-match, step, neg_loc, rank), slot, capacity
            for fc in fcs:
                rank = frag_rank[fc]
                for group in groups:
                    bucket = group.buckets.get((step, fc))
                    if bucket is None or not bucket.count:
                        continue
                    for slot in bucket.members():
                        # (excluded tested only when non-empty: hashing a node id reads one more object per node)
                        if (seen and slot in seen) or (excluded and slot.node_id in excluded):
                            continue
                        if not slot.has_artifacts(job.model_path, job.dataset_path):
                            continue
                        capacity = slot.capacity(job.spec)
                        if capacity > 0:
                            yield (-match, step, 0, rank), slot, capacity


def place_gang(index: ClusterIndex, job: Candidate, rtt: dict[tuple[str, str], float], topology: bool) -> Place | None:
    k = job.k
    candidates: list[tuple[tuple[float, int, int, int], Slot, int]] = []
    total = 0
    boundary: tuple[float, int, int, int] | None = None
    extra = 0
    for key, slot, capacity in walk(index, job):
        if total >= k:
            if not topology or key != boundary or extra >= index.policy.latency_window:
                break
            extra += 1
        else:
            total += capacity
            boundary = key
        candidates.append((key, slot, capacity))
        if len(candidates) == 1 and capacity >= k:
            break  # the best-ranked node takes the whole gang: no mutual latency to weigh
    if total < k:
        return None
    chosen: list[tuple[Slot, int]] = []
    remaining = k
    if topology:
        rtt_sum = [0.0] * len(candidates)
        left = list(range(len(candidates)))
        while remaining > 0:
            best = min(
                left,
                key=lambda i: (candidates[i][0], rtt_sum[i], candidates[i][1].order),
            )
            left.remove(best)
            _key, slot, capacity = candidates[best]
            take = min(capacity, remaining)
            chosen.append((slot, take))
            remaining -= take
            for i in left if remaining > 0 else ():
                rtt_sum[i] += estimated_rtt_ms(candidates[i][1], slot, rtt)
    else:
        for _key, slot, capacity in candidates:
            take = min(capacity, remaining)
            chosen.append((slot, take))
            remaining -= take
            if remaining == 0:
                break
    coordinator = coordinator_of(chosen, rtt)
    if coordinator is None:
        return None
    placements: list[ShardPlacement] = []
    degraded = False
    for slot, take in chosen:
        gpus = slot.free[:take]
        score = round(match_score(slot.group.tflops, job.spec.min_tflops), 4)
        below = not job.is_full_match(slot.group)
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
    return Place(job.spec.job_id, tuple(placements), coordinator.node_id, degraded)


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
        for gpu in slot.free[: slot.capacity(job.spec)]:
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
                degraded=not job.is_full_match(slot.group),
                spare=True,
            )
        )
    return out


def coordinator_of(chosen: list[tuple[Slot, int]], rtt: dict[tuple[str, str], float]) -> Slot | None:
    """The member with the lowest mean RTT to the other shards (S10); it must have a free rendezvous port."""
    best: tuple[float, int] | None = None
    winner: Slot | None = None
    for order, (slot, _take) in enumerate(chosen):
        if not slot.ports:
            continue
        cost = sum(estimated_rtt_ms(slot, other, rtt) * n for other, n in chosen if other is not slot)
        if best is None or (cost, order) < best:
            best, winner = (cost, order), slot
    return winner
