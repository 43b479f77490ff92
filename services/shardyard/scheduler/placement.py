"""Gang placement as a pure function: ``schedule(snapshot, pending, policy, now) -> decisions``.

One cycle, in phases:
1. **index** the frozen snapshot (nodes grouped by GPU model and TFLOPS, bucketed by load step and free GPUs);
2. **order** the pending jobs by effective priority (priority + aging), then by how long they have been ready;
3. **place** each job whole or not at all: filter (alive, not draining, GPU model and TFLOPS — or the job's degraded
   floor once its ``max_wait_s`` has passed — load, free GPUs, memory, CPU, artifacts), rank (best match, least
   load, artifact locality, fragmentation, mutual latency), and make the member with the lowest mean RTT to the
   others the coordinator;
4. a job that does not fit **preempts** lower-priority preemptible gangs when that would make room, else it
   **reserves** the nodes it will need (lower jobs backfill only elsewhere) and is reported **unschedulable** with
   a typed reason and per-filter node counts.

No I/O, no clock: ``now`` comes in.
"""

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime

from shardyard.events import PendingReason, ShardPlacement
from shardyard.gpus import match_score
from shardyard.scheduler.index import ClusterIndex, Group, Slot, norm_path
from shardyard.scheduler.model import (
    Decision,
    NodeView,
    PendingJob,
    Place,
    Policy,
    Preempt,
    RunningJob,
    Snapshot,
    Unschedulable,
    estimated_rtt_ms,
)

NOT_ALIVE = "node not alive"
DRAINING = "node draining"
MODEL = "GPU model mismatch"
TFLOPS = "TFLOPS below minimum"
MATCH = "match below min_match"
NO_GPU = "no free GPU"
RESERVED = "reserved for a higher-priority job"
EXCLUDED = "excluded after a failure"
MEMORY = "insufficient memory"
CPU = "insufficient CPU"
ARTIFACT = "model or dataset absent"
TOO_FEW = "fewer free GPUs than shards"
NO_PORT = "no free rendezvous port"

_RESERVABLE = frozenset(
    {
        PendingReason.INSUFFICIENT_GPUS,
        PendingReason.INSUFFICIENT_MEMORY,
        PendingReason.INSUFFICIENT_CPU,
        PendingReason.RESERVED_FOR_HIGHER_PRIORITY,
        PendingReason.LOAD_TOO_HIGH,
    }
)
"""Reasons that running jobs ending would cure: the job holds a reservation (wrong model, missing artifacts no)."""


def load_filter_name(policy: Policy) -> str:
    return f"load above {policy.load_threshold:.0%}"


def effective_priority(job: PendingJob, policy: Policy, now: datetime) -> float:
    waited_min = max(0.0, (now - job.ready_at).total_seconds()) / 60.0
    return job.spec.priority + policy.aging_per_minute * waited_min


def degraded_allowed(job: PendingJob, now: datetime) -> bool:
    spec = job.spec
    return spec.min_match is not None and (now - job.ready_at).total_seconds() >= spec.max_wait_s


class _Job:
    """A pending job with what every step of its decision needs, computed once."""

    __slots__ = ("dataset_path", "degraded", "eligible", "excluded", "k", "model_path", "pending", "spec")

    def __init__(self, job: PendingJob, index: ClusterIndex, now: datetime) -> None:
        self.pending = job
        self.spec = job.spec
        self.k = job.spec.shard_count
        self.degraded = degraded_allowed(job, now)
        self.excluded = job.excluded_nodes
        self.model_path = norm_path(job.spec.model_path)
        self.dataset_path = norm_path(job.spec.dataset_path)
        self.eligible: dict[tuple[str, float], float] = {}
        """Group key -> match score, for the groups that pass the model/TFLOPS (or degraded) filter."""
        for key, group in index.groups.items():
            if self.why_not(group) is None:
                self.eligible[key] = round(match_score(group.tflops, self.spec.min_tflops), 2)

    def why_not(self, group: Group) -> str | None:
        spec = self.spec
        if self.degraded:
            floor = spec.min_match if spec.min_match is not None else 1.0
            return None if match_score(group.tflops, spec.min_tflops) >= floor - 1e-9 else MATCH
        if spec.gpu_model is not None and group.model != spec.gpu_model:
            return MODEL
        if group.tflops < spec.min_tflops:
            return TFLOPS
        return None

    def is_full_match(self, group: Group) -> bool:
        spec = self.spec
        model_ok = spec.gpu_model is None or group.model == spec.gpu_model
        return model_ok and group.tflops >= spec.min_tflops

    def shape(self) -> tuple[object, ...]:
        spec = self.spec
        return (
            spec.gpu_model,
            spec.min_tflops,
            self.k,
            spec.memory_per_shard,
            spec.cpu_per_shard,
            self.model_path,
            self.dataset_path,
            spec.min_match if self.degraded else None,
            self.excluded,
            spec.priority,
        )


# --- phase 3: place ------------------------------------------------------------------------------------------------
def _frag_order(k: int, max_free: int) -> list[int]:
    """Free-GPU counts in fragmentation order: nodes that take the most shards first, best fit among them."""
    return [*range(k, max_free + 1), *range(min(k - 1, max_free), 0, -1)]


def _walk(index: ClusterIndex, job: _Job) -> Iterator[tuple[tuple[float, int, int, int], Slot, int]]:
    """Nodes that can take shards of ``job``, best ranked first: (rank key, slot, shards it can take)."""
    tiers: dict[float, list[Group]] = {}
    for key, match in job.eligible.items():
        tiers.setdefault(match, []).append(index.groups[key])
    fcs = _frag_order(job.k, index.max_free)
    frag_rank = {fc: rank for rank, fc in enumerate(fcs)}
    excluded = job.excluded
    for match in sorted(tiers, reverse=True):
        groups = tiers[match]
        for step in range(index.load_steps):
            # Locality first within the tier: nodes holding the job's model or dataset on local disk. At most
            # k + latency_window of them are weighed, so the cost stays flat when an artifact is cached widely.
            seen: set[str] = set()
            local: list[tuple[int, int, float, str]] = []
            room = job.k + index.policy.latency_window
            for group in groups:
                for path in (job.model_path, job.dataset_path):
                    for node_id in index.local_nodes(path, group, step):
                        if len(local) >= room:
                            break
                        slot = index.slots[node_id]
                        if node_id in seen or slot.bucket is None or not slot.free:
                            continue
                        seen.add(node_id)
                        loc = slot.locality(job.model_path, job.dataset_path)
                        local.append((-loc, frag_rank.get(len(slot.free), len(fcs)), slot.view.cpu_load, node_id))
            for neg_loc, rank, _load, node_id in sorted(local):
                slot = index.slots[node_id]
                if node_id in job.excluded or not slot.has_artifacts(job.model_path, job.dataset_path):
                    continue
                capacity = slot.capacity(job.spec)
                if capacity > 0:
                    yield (-match, step, neg_loc, rank), slot, capacity
            for fc in fcs:
                rank = frag_rank[fc]
                for group in groups:
                    entries = group.buckets.get((step, fc))
                    if not entries:
                        continue
                    for _load, node_id, slot in entries:
                        # (tested only when non-empty: hashing a node id touches one more object per node)
                        if (seen and node_id in seen) or (excluded and node_id in excluded):
                            continue
                        if not slot.has_artifacts(job.model_path, job.dataset_path):
                            continue
                        capacity = slot.capacity(job.spec)
                        if capacity > 0:
                            yield (-match, step, 0, rank), slot, capacity


def _place(index: ClusterIndex, job: _Job, rtt: dict[tuple[str, str], float], topology: bool) -> Place | None:
    k = job.k
    candidates: list[tuple[tuple[float, int, int, int], Slot, int]] = []
    total = 0
    boundary: tuple[float, int, int, int] | None = None
    extra = 0
    for key, slot, capacity in _walk(index, job):
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
                key=lambda i: (candidates[i][0], rtt_sum[i], candidates[i][1].view.cpu_load, candidates[i][1].node_id),
            )
            left.remove(best)
            _key, slot, capacity = candidates[best]
            take = min(capacity, remaining)
            chosen.append((slot, take))
            remaining -= take
            for i in left if remaining > 0 else ():
                rtt_sum[i] += estimated_rtt_ms(candidates[i][1].view, slot.view, rtt)
    else:
        for _key, slot, capacity in candidates:
            take = min(capacity, remaining)
            chosen.append((slot, take))
            remaining -= take
            if remaining == 0:
                break
    coordinator = _coordinator(chosen, rtt)
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
                    gpu_model=slot.view.gpu_model,
                    match_score=score,
                    degraded=below,
                )
            )
        index.take(slot, gpus, job.spec, coordinator=slot is coordinator)
    if job.pending.spares:
        placements.extend(_spares(index, job, {slot.node_id for slot, _ in chosen}, len(placements)))
    return Place(job.spec.job_id, tuple(placements), coordinator.node_id, degraded)


def _spares(index: ClusterIndex, job: _Job, gang_nodes: set[str], first_index: int) -> list[ShardPlacement]:
    """Up to ``job.pending.spares`` spare GPUs, one per node and off the gang's nodes first (a spare must survive
    the loss of a gang node); on the gang's nodes only when nothing else is free."""
    wanted = job.pending.spares
    picked: list[tuple[Slot, int]] = []
    used: set[str] = set()
    for _key, slot, _capacity in _walk(index, job):
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
                gpu_model=slot.view.gpu_model,
                match_score=round(match_score(slot.group.tflops, job.spec.min_tflops), 4),
                degraded=not job.is_full_match(slot.group),
                spare=True,
            )
        )
    return out


def _coordinator(chosen: list[tuple[Slot, int]], rtt: dict[tuple[str, str], float]) -> Slot | None:
    """The member with the lowest mean RTT to the other shards (S10); it must have a free rendezvous port."""
    best: tuple[float, int] | None = None
    winner: Slot | None = None
    for order, (slot, _take) in enumerate(chosen):
        if not slot.ports:
            continue
        cost = sum(estimated_rtt_ms(slot.view, other.view, rtt) * n for other, n in chosen if other is not slot)
        if best is None or (cost, order) < best:
            best, winner = (cost, order), slot
    return winner


# --- phase 4: explain, preempt, reserve ----------------------------------------------------------------------------
def _explain(index: ClusterIndex, job: _Job, now: datetime) -> tuple[Unschedulable, int]:
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
        for (_step, fc), entries in group.buckets.items():
            if fc == 0:
                counts[NO_GPU] += len(entries)
                continue
            for _load, node_id, slot in entries:
                if node_id in job.excluded:
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
    shown = {name: count for name, count in counts.most_common() if count}
    parts = ", ".join(f"{count} {name}" for name, count in shown.items())
    wanted = f"{k} x {spec.gpu_model or 'any GPU'} (>= {spec.min_tflops:g} TFLOPS)"
    message = f"0/{total_nodes} nodes can take the gang of {wanted}: {parts or 'no nodes'}"
    if spec.min_match is not None and not job.degraded:
        wait = spec.max_wait_s - (now - job.pending.ready_at).total_seconds()
        message += f"; degraded placement (match >= {spec.min_match:g}) allowed in {max(0.0, wait):.0f}s"
    return Unschedulable(spec.job_id, reason, message, shown), passing


def _reason(
    job: _Job,
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


def _preemption(index: ClusterIndex, job: _Job, running: Sequence[RunningJob], passing: int) -> list[RunningJob]:
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


def _could_host(index: ClusterIndex, slot: Slot, job: _Job) -> bool:
    return (
        (slot.group.model, slot.group.tflops) in job.eligible
        and slot.reserved_for is None
        and slot.view.draining is False
        and slot.view.cpu_load < index.policy.load_threshold
        and slot.node_id not in job.excluded
        and slot.has_artifacts(job.model_path, job.dataset_path)
        and slot.view.status.value == "ALIVE"
    )


def _capacity_with(slot: Slot, job: _Job, extra: list[float] | None) -> int:
    gpus, memory, cpu = extra or (0.0, 0.0, 0.0)
    spec = job.spec
    count = len(slot.free) + int(gpus)
    if spec.memory_per_shard:
        count = min(count, int((slot.memory + memory) // spec.memory_per_shard))
    if spec.cpu_per_shard:
        count = min(count, int((slot.cpu + cpu) / spec.cpu_per_shard + 1e-9))
    return count


def _reserve(index: ClusterIndex, job: _Job) -> None:
    """Hold the nodes ``job`` is closest to fitting on (most free GPUs first) until their GPUs could host it."""
    potential = 0
    order = sorted(
        (
            (-len(index.slots[node_id].free), step, load, node_id)
            for key in job.eligible
            for (step, _fc), entries in index.groups[key].buckets.items()
            for load, node_id, _slot in entries
            if node_id not in job.excluded
        ),
    )
    plan: list[Slot] = []
    for _neg_free, _step, _load, node_id in order:
        slot = index.slots[node_id]
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


class PlacementCycle:
    """One scheduling cycle over a snapshot: ``decide`` each pending job in queue order (``schedule`` does).

    Building the cycle indexes the snapshot once; each ``decide`` then costs about the same at any cluster size.
    """

    def __init__(self, snapshot: Snapshot, policy: Policy | None = None, *, now: datetime) -> None:
        self.policy = policy or Policy()
        self.now = now
        self.running = snapshot.running
        self.index = ClusterIndex(snapshot.nodes, self.policy)
        self.rtt = dict(snapshot.rtt_ms)
        self.topology = bool(self.rtt) or any(view.zone or view.rack for view in snapshot.nodes)
        self.waiting_on: dict[str, list[RunningJob]] = {}
        for gang in snapshot.running:
            if gang.preempted_by is not None:
                self.waiting_on.setdefault(gang.preempted_by, []).append(gang)
        self.unplaceable: dict[tuple[object, ...], Unschedulable] = {}
        self.reservations = self.policy.reservations

    def order(self, pending: Sequence[PendingJob]) -> list[PendingJob]:
        """Queue order: effective priority (priority + aging), then the longest ready, then the job id."""
        now, policy = self.now, self.policy
        return sorted(pending, key=lambda p: (-effective_priority(p, policy, now), p.ready_at, p.spec.job_id))

    def decide(self, pending_job: PendingJob) -> list[Decision]:
        """The decisions for one job: [Place], [Preempt..., Unschedulable(PREEMPTING)] or [Unschedulable]."""
        index, policy = self.index, self.policy
        if pending_job.not_before is not None and self.now < pending_job.not_before:
            wait = (pending_job.not_before - self.now).total_seconds()
            message = f"recovering: retry backoff, next attempt in {wait:.1f}s"
            return [Unschedulable(pending_job.spec.job_id, PendingReason.RETRY_BACKOFF, message)]
        job = _Job(pending_job, index, self.now)
        shape = job.shape()
        known = self.unplaceable.get(shape)
        if known is not None:
            return [replace(known, job_id=job.spec.job_id)]
        placed = _place(index, job, self.rtt, self.topology) if job.eligible else None
        if placed is not None:
            return [placed]
        verdict, passing = _explain(index, job, self.now)
        victims = self.waiting_on.get(job.spec.job_id)
        if victims:
            _hold(index, victims, job.spec.job_id)
            return [_preempting(verdict, victims)]
        if policy.preemption and verdict.reason is not PendingReason.WAITING_FOR_ARTIFACT and job.eligible:
            chosen = _preemption(index, job, self.running, passing)
            if chosen:
                _hold(index, chosen, job.spec.job_id)
                return [*(Preempt(victim.job_id, job.spec.job_id) for victim in chosen), _preempting(verdict, chosen)]
        self.unplaceable[shape] = verdict
        if self.reservations > 0 and verdict.reason in _RESERVABLE:
            self.reservations -= 1
            _reserve(index, job)
        return [verdict]


def schedule(
    snapshot: Snapshot, pending: Sequence[PendingJob], policy: Policy | None = None, *, now: datetime
) -> list[Decision]:
    """Decide for every pending job, in queue order. Returns Place, Preempt and Unschedulable decisions."""
    cycle = PlacementCycle(snapshot, policy, now=now)
    decisions: list[Decision] = []
    for job in cycle.order(pending):
        decisions.extend(cycle.decide(job))
    return decisions


def _hold(index: ClusterIndex, victims: Sequence[RunningJob], job_id: str) -> None:
    for victim in victims:
        for node_id, _gpus in victim.shards:
            slot = index.slots.get(node_id)
            if slot is not None:
                index.reserve(slot, job_id)


def _preempting(verdict: Unschedulable, victims: Sequence[RunningJob]) -> Unschedulable:
    names = ", ".join(sorted(v.job_id for v in victims))
    return replace(
        verdict,
        reason=PendingReason.PREEMPTING,
        message=f"preempting {names} (checkpoint, then requeue) to make room; {verdict.message}",
    )


def place_one(nodes: Sequence[NodeView], job: PendingJob, policy: Policy | None = None, *, now: datetime) -> Decision:
    """The decision for one job alone on ``nodes`` (tests, the simulator's what-ifs)."""
    return schedule(Snapshot(tuple(nodes)), [job], policy, now=now)[-1]
