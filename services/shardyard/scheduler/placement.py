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
    chosen: list[ShardPlacement] = []
    for node in candidates:
        take = min(_capacity(node, spec), spec.shard_count - len(chosen))
        for gpu in node.free_gpus[:take]:
            chosen.append(
                ShardPlacement(
                    shard_index=len(chosen),
                    node_id=node.node_id,
                    gpu_indices=(gpu,),
                    gpu_model=node.gpu_model,
                    match_score=round(match_score(node.tflops, spec.min_tflops), 4),
                )
            )
        if len(chosen) == spec.shard_count:
            coordinator = next(n for n in candidates if n.node_id == chosen[0].node_id)
            if not coordinator.rendezvous_ports:
                excluded["no free rendezvous port"] += 1
                break
            return Place(spec.job_id, tuple(chosen), coordinator.node_id)
    free = sum(_capacity(n, spec) for n in candidates)
    if free:
        excluded["fewer free GPUs than shards"] = len(candidates)
    parts = ", ".join(f"{count} {why}" for why, count in excluded.most_common())
    message = (
        f"0/{len(nodes)} nodes can take the gang of {spec.shard_count} x "
        f"{spec.gpu_model or 'any GPU'} (>= {spec.min_tflops:g} TFLOPS): {parts or 'no capacity'}"
    )
    reason = _reason(excluded) if not free else PendingReason.INSUFFICIENT_GPUS
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
