"""Gang placement as a pure function over a frozen snapshot: ``schedule(snapshot, pending, now) -> decisions``.

This is the skeleton policy: hard filters on liveness, GPU model, TFLOPS, free GPUs, memory and CPU; nodes ranked by
match score, then load; a job is placed whole (every shard on its own GPU) or not at all. No I/O, no clock.
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from shardyard.events import JobSpec, NodeStatus, PendingReason, ShardPlacement
from shardyard.gpus import canonical_model, match_score


@dataclass(frozen=True)
class NodeView:
    """One node as the policy sees it in a cycle."""

    node_id: str
    status: NodeStatus
    address: str
    gpu_model: str
    tflops: float
    free_gpus: tuple[int, ...]
    free_memory_bytes: int
    free_cpu_cores: float
    cpu_load: float
    rendezvous_ports: tuple[int, ...] = ()
    """Free ports of the node's rendezvous range (a gang's coordinator listens on one)."""


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeView, ...]


@dataclass(frozen=True)
class Place:
    job_id: str
    placements: tuple[ShardPlacement, ...]
    coordinator_node: str


@dataclass(frozen=True)
class Unschedulable:
    job_id: str
    reason: PendingReason
    message: str
    node_counts: dict[str, int] = field(default_factory=dict)


Decision = Place | Unschedulable


def _exclusion(node: NodeView, spec: JobSpec) -> str | None:
    """Why ``node`` cannot host even one shard of ``spec``; None when it can."""
    if node.status is not NodeStatus.ALIVE:
        return "node not alive"
    if spec.gpu_model is not None and canonical_model(node.gpu_model) != spec.gpu_model:
        return "GPU model mismatch"
    if node.tflops < spec.min_tflops:
        return "TFLOPS below minimum"
    if not node.free_gpus:
        return "no free GPU"
    if node.free_memory_bytes < spec.memory_per_shard:
        return "insufficient memory"
    if node.free_cpu_cores < spec.cpu_per_shard:
        return "insufficient CPU"
    return None


def _reason(counts: Counter[str]) -> PendingReason:
    if counts.get("GPU model mismatch", 0) and len(counts) == 1:
        return PendingReason.GPU_MODEL_MISMATCH
    if counts.get("TFLOPS below minimum", 0) and len(counts) == 1:
        return PendingReason.INSUFFICIENT_TFLOPS
    return PendingReason.NO_FIT


def _capacity(node: NodeView, spec: JobSpec) -> int:
    by_memory = node.free_memory_bytes // spec.memory_per_shard if spec.memory_per_shard else len(node.free_gpus)
    by_cpu = int(node.free_cpu_cores // spec.cpu_per_shard) if spec.cpu_per_shard else len(node.free_gpus)
    return min(len(node.free_gpus), by_memory, by_cpu)


def place_job(nodes: Sequence[NodeView], spec: JobSpec) -> Decision:
    if not nodes:
        return Unschedulable(spec.job_id, PendingReason.NO_NODES, "no nodes have joined the cluster")
    excluded: Counter[str] = Counter()
    candidates: list[NodeView] = []
    for node in nodes:
        why = _exclusion(node, spec)
        if why is None:
            candidates.append(node)
        else:
            excluded[why] += 1
    candidates.sort(key=lambda n: (-match_score(n.tflops, spec.min_tflops), n.cpu_load, -len(n.free_gpus), n.node_id))
    # Rank 0 hosts the rendezvous store: the gang is built around the best-ranked node with a free port.
    coordinator = next((n for n in candidates if n.rendezvous_ports and _capacity(n, spec) > 0), None)
    chosen: list[tuple[NodeView, int]] = []
    if coordinator is not None:
        for node in [coordinator, *(n for n in candidates if n.node_id != coordinator.node_id)]:
            take = min(_capacity(node, spec), spec.shard_count - len(chosen))
            chosen.extend((node, gpu) for gpu in node.free_gpus[:take])
            if len(chosen) == spec.shard_count:
                placements = tuple(
                    ShardPlacement(
                        shard_index=index,
                        node_id=placed.node_id,
                        gpu_indices=(gpu,),
                        gpu_model=placed.gpu_model,
                        match_score=round(match_score(placed.tflops, spec.min_tflops), 4),
                    )
                    for index, (placed, gpu) in enumerate(chosen)
                )
                return Place(spec.job_id, placements, coordinator.node_id)
    elif candidates:
        excluded["no free rendezvous port"] = sum(1 for n in candidates if not n.rendezvous_ports)
    free = sum(_capacity(n, spec) for n in candidates)
    if 0 < free < spec.shard_count:
        excluded["fewer free GPUs than shards"] = len(candidates)
    parts = ", ".join(f"{count} {why}" for why, count in excluded.most_common())
    message = (
        f"0/{len(nodes)} nodes can take the gang of {spec.shard_count} x "
        f"{spec.gpu_model or 'any GPU'} (>= {spec.min_tflops:g} TFLOPS): {parts or 'no capacity'}"
    )
    reason = PendingReason.INSUFFICIENT_GPUS if 0 < free < spec.shard_count else _reason(excluded)
    return Unschedulable(spec.job_id, reason, message, dict(excluded))


def _take(nodes: list[NodeView], place: Place, spec: JobSpec) -> list[NodeView]:
    """The nodes after ``place`` is admitted in this cycle (its GPUs, memory, CPU and port no longer free)."""
    used: dict[str, list[ShardPlacement]] = {}
    for shard in place.placements:
        used.setdefault(shard.node_id, []).append(shard)
    out = []
    for node in nodes:
        shards = used.get(node.node_id)
        if not shards:
            out.append(node)
            continue
        taken = {g for s in shards for g in s.gpu_indices}
        is_coordinator = node.node_id == place.coordinator_node
        out.append(
            replace(
                node,
                free_gpus=tuple(g for g in node.free_gpus if g not in taken),
                free_memory_bytes=node.free_memory_bytes - spec.memory_per_shard * len(shards),
                free_cpu_cores=node.free_cpu_cores - spec.cpu_per_shard * len(shards),
                rendezvous_ports=node.rendezvous_ports[1:] if is_coordinator else node.rendezvous_ports,
            )
        )
    return out


def schedule(snapshot: Snapshot, pending: Sequence[JobSpec], now: datetime) -> list[Decision]:
    """Decide for each pending job, highest priority first, oldest first among equals."""
    del now  # the skeleton policy has no time-dependent rule yet (aging comes with the full policy)
    nodes = list(snapshot.nodes)
    decisions: list[Decision] = []
    for spec in sorted(pending, key=lambda s: (-s.priority, s.submitted_at, s.job_id)):
        decision = place_job(nodes, spec)
        if isinstance(decision, Place):
            nodes = _take(nodes, decision, spec)
        decisions.append(decision)
    return decisions
