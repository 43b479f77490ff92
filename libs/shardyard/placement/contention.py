"""When a job does not fit: why (a typed reason with per-filter node counts), whom to preempt, what to reserve.
Pure."""

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from shardyard.events import PendingReason
from shardyard.placement.candidate import (
    ARTIFACT,
    CPU,
    DRAINING,
    EXCLUDED,
    MATCH,
    MEMORY,
    MODEL,
    NO_GPU,
    NO_PORT,
    NOT_ALIVE,
    RESERVED,
    TFLOPS,
    TOO_FEW,
    Candidate,
    load_filter_name,
)
from shardyard.placement.index import ClusterIndex, Slot
from shardyard.placement.model import (
    RunningJob,
    Unschedulable,
)


def explain(index: ClusterIndex, job: Candidate, now: datetime) -> tuple[Unschedulable, int]:
    """Why ``job`` cannot be placed: a typed reason, a message and node counts by first failing filter; also the
    shards it could place now (for the preemption estimate)."""
    policy = index.policy
    spec = job.spec
    load_name = load_filter_name(policy)
    counts: Counter[str] = Counter()
    survivors = 0
    free_before = load_free = reserved_free = excluded_free = memory_free = cpu_free = artifact_free = 0
    passing = passing_nodes = 0
    for key, group in index.groups.items():
        counts[NOT_ALIVE] += group.dead
        counts[DRAINING] += group.draining
        rest = group.nodes_total() - group.dead - group.draining
        if key not in job.eligible:
            why = job.why_not(group)
            counts[why or MODEL] += rest
            continue
        survivors += rest
        counts[load_name] += group.overloaded
        counts[RESERVED] += group.reserved
        load_free += group.overloaded_free
        reserved_free += group.reserved_free
        free_before += group.overloaded_free + group.reserved_free + group.free_gpus
        for (_step, fc), bucket in group.buckets.items():
            if fc == 0:
                counts[NO_GPU] += bucket.count
                continue
            for slot in bucket.members():
                if slot.node_id in job.excluded:
                    counts[EXCLUDED] += 1
                    excluded_free += fc
                elif spec.memory_per_shard and slot.memory < spec.memory_per_shard:
                    counts[MEMORY] += 1
                    memory_free += fc
                elif spec.cpu_per_shard and slot.cpu + 1e-9 < spec.cpu_per_shard:
                    counts[CPU] += 1
                    cpu_free += fc
                elif not slot.has_artifacts(job.model_path, job.dataset_path):
                    counts[ARTIFACT] += 1
                    artifact_free += slot.capacity(spec)
                else:
                    passing += slot.capacity(spec)
                    passing_nodes += 1
    k = job.k
    total_nodes = sum(group.nodes_total() for group in index.groups.values())
    if passing_nodes and passing < k:
        counts[TOO_FEW] += passing_nodes
    elif passing >= k:
        counts[NO_PORT] += passing_nodes
    reason = _reason(
        job,
        total_nodes,
        survivors,
        counts,
        [
            (free_before, PendingReason.INSUFFICIENT_GPUS),
            (load_free, PendingReason.LOAD_TOO_HIGH),
            (reserved_free, PendingReason.RESERVED_FOR_HIGHER_PRIORITY),
            (excluded_free, PendingReason.NO_FIT),
            (memory_free, PendingReason.INSUFFICIENT_MEMORY),
            (cpu_free, PendingReason.INSUFFICIENT_CPU),
            (artifact_free, PendingReason.WAITING_FOR_ARTIFACT),
        ],
        passing,
    )
    # Ties by name: the message is the same whatever order the index met the nodes in.
    shown = {name: count for name, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if count}
    parts = ", ".join(f"{count} {name}" for name, count in shown.items())
    wanted = f"{k} x {spec.gpu_model or 'any GPU'} (>= {spec.min_tflops:g} TFLOPS)"
    message = f"0/{total_nodes} nodes can take the gang of {wanted}: {parts or 'no nodes'}"
    if spec.min_match is not None and not job.degraded:
        wait = spec.max_wait_s - (now - job.pending.ready_at).total_seconds()
        message += f"; degraded placement (match >= {spec.min_match:g}) allowed in {max(0.0, wait):.0f}s"
    return Unschedulable(spec.job_id, reason, message, shown), passing


def _reason(
    job: Candidate,
    total_nodes: int,
    survivors: int,
    counts: Counter[str],
    stages: list[tuple[int, PendingReason]],
    passing: int,
) -> PendingReason:
    """The filter that made the gang impossible: identity filters when no node of the right kind is usable at all,
    else the first capacity stage after which fewer than ``k`` GPUs remain."""
    if total_nodes == 0:
        return PendingReason.NO_NODES
    if survivors == 0:
        if counts[MODEL] or counts[MATCH]:
            return PendingReason.GPU_MODEL_MISMATCH
        if counts[TFLOPS]:
            return PendingReason.INSUFFICIENT_TFLOPS
        return PendingReason.NO_FIT
    remaining = stages[0][0]
    if remaining < job.k:
        return PendingReason.INSUFFICIENT_GPUS
    for removed, reason in stages[1:]:
        remaining -= removed
        if remaining < job.k:
            return reason
    return PendingReason.INSUFFICIENT_GPUS if passing < job.k else PendingReason.NO_FIT


def choose_victims(
    index: ClusterIndex, job: Candidate, running: Sequence[RunningJob], passing: int
) -> list[RunningJob]:
    """The fewest lower-priority preemptible gangs (lowest priority, most recently started first) whose GPUs make
    room for ``job``; empty when even all of them would not."""
    spec = job.spec
    victims = sorted(
        (r for r in running if r.preemptible and r.priority < spec.priority and r.preempted_by is None),
        key=lambda r: (r.priority, -r.started_at.timestamp(), r.job_id),
    )
    freed: dict[str, list[float]] = {}  # node -> [gpus, memory, cpu]
    chosen: list[RunningJob] = []
    total = passing
    for victim in victims:
        gain = 0
        for node_id, gpus in victim.shards:
            slot = index.slots.get(node_id)
            if slot is None or not _could_host(index, slot, job):
                continue
            before = _capacity_with(slot, job, freed.get(node_id))
            extra = freed.setdefault(node_id, [0.0, 0.0, 0.0])
            extra[0] += len(gpus)
            extra[1] += victim.memory_per_shard
            extra[2] += victim.cpu_per_shard
            gain += _capacity_with(slot, job, extra) - before
        if gain <= 0:
            continue
        chosen.append(victim)
        total += gain
        if total >= job.k:
            return chosen
    return []


def _could_host(index: ClusterIndex, slot: Slot, job: Candidate) -> bool:
    return (
        (slot.group.model, slot.group.tflops) in job.eligible
        and slot.reserved_for is None
        and slot.view.draining is False
        and slot.view.cpu_load < index.policy.load_threshold
        and slot.node_id not in job.excluded
        and slot.has_artifacts(job.model_path, job.dataset_path)
        and slot.view.status.value == "ALIVE"
    )


def _capacity_with(slot: Slot, job: Candidate, extra: list[float] | None) -> int:
    gpus, memory, cpu = extra or (0.0, 0.0, 0.0)
    spec = job.spec
    count = len(slot.free) + int(gpus)
    if spec.memory_per_shard:
        count = min(count, int((slot.memory + memory) // spec.memory_per_shard))
    if spec.cpu_per_shard:
        count = min(count, int((slot.cpu + cpu) / spec.cpu_per_shard + 1e-9))
    return count


def reserve_for(index: ClusterIndex, job: Candidate) -> None:
    """Hold the nodes ``job`` is closest to fitting on (most free GPUs first) until their GPUs could host it."""
    potential = 0
    order = sorted(
        (-len(slot.free), step, slot.order, slot)
        for key in job.eligible
        for (step, _fc), bucket in index.groups[key].buckets.items()
        for slot in bucket.members()
        if slot.node_id not in job.excluded
    )
    plan: list[Slot] = []
    for _neg_free, _step, _order, slot in order:
        if not slot.has_artifacts(job.model_path, job.dataset_path):
            continue
        could = slot.view.potential(job.spec.memory_per_shard, job.spec.cpu_per_shard)
        if could <= 0:
            continue
        plan.append(slot)
        potential += could
        if potential >= job.k:
            for held in plan:
                index.reserve(held, job.spec.job_id)
            return


def hold_for(index: ClusterIndex, victims: Sequence[RunningJob], job_id: str) -> None:
    for victim in victims:
        for node_id, _gpus in victim.shards:
            slot = index.slots.get(node_id)
            if slot is not None:
                index.reserve(slot, job_id)


def preempting_verdict(verdict: Unschedulable, victims: Sequence[RunningJob]) -> Unschedulable:
    names = ", ".join(sorted(v.job_id for v in victims))
    return replace(
        verdict,
        reason=PendingReason.PREEMPTING,
        message=f"preempting {names} (checkpoint, then requeue) to make room; {verdict.message}",
    )
