"""When a job does not fit: why (a typed reason with per-filter node counts), whom to preempt, what to reserve.
Pure.

The "why" reads the filter table (``filters``) as placing does: every node counts under the first filter it fails,
in table order, and the reason is that of the filter that left fewer free GPUs than the gang has shards.
"""

import heapq
from dataclasses import dataclass, field
from datetime import datetime

from shardyard.events import MissingArtifact, PendingReason
from shardyard.events.node import MAX_NAMED_NODES
from shardyard.mounts import host_path
from shardyard.placement.candidate import Candidate
from shardyard.placement.filters import (
    BY_NAME,
    CAPACITY,
    CAPPED,
    DISK,
    GANG_FILTERS,
    GROUP_FILTERS,
    IDENTITY,
    Filter,
    GangFilter,
    Match,
    StateFilter,
    absent_artifacts,
    bucket_failing,
    could_host,
    gang_failing,
    group_failing,
    node_failing,
    shards,
)
from shardyard.placement.index import ClusterIndex, Group, Slot, norm_path
from shardyard.placement.inventory import never_fits
from shardyard.placement.model import NodeView, Unschedulable
from shardyard.units import format_bytes


@dataclass
class Tally:
    """One job's nodes, filter by filter: those each filter stopped first, and those that pass them all."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BY_NAME, 0))
    """Filter name -> the nodes it stopped first."""
    withheld: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BY_NAME, 0))
    """Filter name -> the free GPUs of those nodes, past the identity filters: what the job lost to it."""
    nodes: int = 0
    """All nodes of the index."""
    survivors: int = 0
    """Nodes that pass the identity filters: up, and of the kind the job asks for."""
    free: int = 0
    """Their free GPUs."""
    passing: list[tuple[Slot, int]] = field(default_factory=list)
    """The nodes that pass every state, group, bucket and node filter, with the shards each can take."""
    gang: GangFilter | None = None
    """The first gang filter ``passing`` fails (None: the gang would fit)."""

    @property
    def shards(self) -> int:
        return sum(capacity for _slot, capacity in self.passing)

    def stop(self, name: str, nodes: int, free: int = 0) -> None:
        self.counts[name] += nodes
        self.withheld[name] += free


def tally(index: ClusterIndex, job: Candidate) -> Tally:
    """Count ``job``'s nodes by the first filter each fails; the nodes that fail none, and the gang filter they do."""
    counted = Tally()
    for key, group in index.groups.items():
        _tally_group(counted, group, job, key in job.eligible)
    counted.gang = gang_failing(counted.passing, job)
    return counted


def _tally_group(counted: Tally, group: Group, job: Candidate, eligible: bool) -> None:
    """Count one group's nodes: those its tallies hold under a state filter, the whole rest when the group fails a
    group filter, else those of its buckets by bucket and node filter."""
    nodes = group.nodes_total()
    counted.nodes += nodes
    failed = None if eligible else group_failing(group, job)
    held, held_free = group.held, group.held_free
    for f in IDENTITY:
        if f is failed:
            counted.stop(f.name, nodes)  # the rest of the group is the wrong kind
            return
        if isinstance(f, StateFilter) and held[f.name]:
            counted.stop(f.name, held[f.name])
            nodes -= held[f.name]
    counted.survivors += nodes
    counted.free += group.free_gpus
    for f in CAPACITY:
        if isinstance(f, StateFilter) and held[f.name]:
            counted.stop(f.name, held[f.name], held_free[f.name])
            counted.free += held_free[f.name]
    for (_step, free), bucket in group.buckets.items():
        if not bucket.count:
            continue
        failed_bucket = bucket_failing(free)
        if failed_bucket is not None:
            counted.stop(failed_bucket.name, bucket.count, free * bucket.count)
            continue
        for slot in bucket.members():
            failed_node = node_failing(slot, job)
            if failed_node is None:
                counted.passing.append((slot, slot.capacity(job)))
            else:
                withheld = slot.capacity(job) if failed_node.name in CAPPED else free
                counted.stop(failed_node.name, 1, withheld)


def explain(index: ClusterIndex, job: Candidate, now: datetime) -> tuple[Unschedulable, int]:
    """Why ``job`` cannot be placed: a typed reason, a message and node counts by first failing filter; also the
    shards it could place now (for the preemption estimate)."""
    counted = tally(index, job)
    # Explain runs once placing failed. Where the passing nodes would hold the gang, placing failed on the members
    # it chose (the best ranked), none of which had a free port: that too counts as the last gang filter's.
    gang = counted.gang or GANG_FILTERS[-1]
    counted.stop(gang.name, len(counted.passing))
    policy, spec = index.policy, job.spec
    # Ties by name: the message is the same whatever order the index met the nodes in.
    counts = ((BY_NAME[name].label(policy), count) for name, count in counted.counts.items() if count)
    shown = dict(sorted(counts, key=_by_count))
    parts = ", ".join(f"{count} {label}" for label, count in shown.items())
    wanted = f"{job.k} x {spec.gpu_model or 'any GPU'} (>= {spec.min_tflops:g} TFLOPS)"
    message = f"0/{counted.nodes} nodes can take the gang of {wanted}: {parts or 'no nodes'}"
    if spec.min_match is not None and not job.degraded:
        wait = spec.max_wait_s - (now - job.pending.ready_at).total_seconds()
        message += f"; degraded placement (match >= {spec.min_match:g}) allowed in {max(0.0, wait):.0f}s"
    reason = _reason(counted, job.k)
    if (never := never_fits(index, job)) is not None:
        return Unschedulable(spec.job_id, PendingReason.NEVER_FITS, f"{never}; {message}", shown), counted.shards
    if reason is PendingReason.DISK_FULL:
        message += f"; {full_disks(index, job)}"
    lacked = missing(index, job) if reason is PendingReason.WAITING_FOR_ARTIFACT else ()
    message += "".join(f"; {lacking(artifact)}" for artifact in lacked)
    if reason is PendingReason.WAITING_FOR_ARTIFACT and not lacked:
        message += "; the nodes' agents have not reported on its model and dataset yet"
    return Unschedulable(spec.job_id, reason, message, shown, missing=lacked), counted.shards


MAX_NAMED = 8
"""Nodes a DISK_FULL message names at most (the count says how many there are)."""


def full_disks(index: ClusterIndex, job: Candidate) -> str:
    """``output disks too full: node-a (12MiB free), node-b (0B free)``: the nodes of the job's kind that the disk
    filter holds out. Worked out only for a job that waits for it (a scan of the nodes), so that whoever reads the
    reason knows which disks to clean up."""
    full = sorted(
        (slot.node_id, slot.view.disk_free_bytes or 0)
        for slot in index.slots.values()
        if slot.held_by == DISK and (slot.group.model, slot.group.tflops) in job.eligible
    )
    named = ", ".join(f"{node} ({format_bytes(free)} free)" for node, free in full[:MAX_NAMED])
    more = f" and {len(full) - MAX_NAMED} more" if len(full) > MAX_NAMED else ""
    return f"output disks below {index.policy.disk_floor} free: {named}{more}"


_IDENTITY_STATES = frozenset(f.name for f in IDENTITY if isinstance(f, StateFilter))


def missing(index: ClusterIndex, job: Candidate) -> tuple[MissingArtifact, ...]:
    """The job's paths (pretrained model, dataset) that nodes it could use (up, not draining, of its GPU kind) lack:
    each with how many lack it, the first few by id, and where each of those mounts it. Worked out only for a job
    that waits for them (a scan of the nodes), so that whoever reads the reason knows what to put where. A node lacks
    a path once its agent has reported it absent; one whose agent has not looked yet (the job is new to it) is only
    counted ``unchecked``, and a path no agent has reported absent is left out: the job does not wait for it yet."""
    usable = 0
    lacked: dict[str, list[Slot]] = {job.model_path: [], job.dataset_path: []}
    unchecked = dict.fromkeys(lacked, 0)
    for slot in index.slots.values():
        if slot.held_by in _IDENTITY_STATES or (slot.group.model, slot.group.tflops) not in job.eligible:
            continue
        usable += 1
        said, looked = slot.view.absent_artifacts, None
        for path in absent_artifacts(slot, job):
            looked = looked if looked is not None or said is None else {norm_path(p) for p in said}
            if looked is None or path in looked:
                lacked[path].append(slot)
            else:
                unchecked[path] += 1  # its agent has not looked yet: absent for now, not known missing
    written = {job.model_path: job.spec.model_path, job.dataset_path: job.spec.dataset_path}
    found = []
    for path, slots in lacked.items():
        if not slots:
            continue
        named = heapq.nsmallest(MAX_NAMED_NODES, slots, key=lambda slot: slot.node_id)
        hosts = {slot.node_id: host_path(written[path], slot.view.mounts) for slot in named}
        found.append(
            MissingArtifact(
                path=written[path],
                nodes=tuple(slot.node_id for slot in named),
                lacking=len(slots),
                unchecked=unchecked[path],
                of_nodes=usable,
                host_paths={node: host for node, host in hosts.items() if host is not None},
            )
        )
    return tuple(found)


def lacking(artifact: MissingArtifact) -> str:
    """``/data/datasets/x absent on every node it could use (node-0, node-1): put it at /srv/data/datasets/x``, or
    ``on 2 of the 40 nodes it could use (...)``: the first nodes and how many more, and where to put it when the
    named nodes agree on that (and it is not the path itself: a node without mounts)."""
    more = artifact.lacking - len(artifact.nodes)
    named = ", ".join(artifact.nodes) + (f" and {more} more" if more > 0 else "")
    every = artifact.lacking == artifact.of_nodes
    where = "every node" if every else f"{artifact.lacking} of the {artifact.of_nodes} nodes"
    text = f"{artifact.path} absent on {where} it could use ({named})"
    hosts = set(artifact.host_paths.values())
    if not hosts:
        return text + ": not under a mount of those nodes"
    if len(hosts) == 1 and len(artifact.host_paths) == len(artifact.nodes) and hosts != {artifact.path}:
        return text + f": put it at {hosts.pop()}"
    return text


def _by_count(labelled: tuple[str, int]) -> tuple[int, str]:
    return -labelled[1], labelled[0]


def _reason(counted: Tally, k: int) -> PendingReason:
    """The filter that made the gang impossible: identity filters when no node of the right kind is up at all,
    else the first capacity filter after which fewer than ``k`` free GPUs remain, else the gang filter."""
    if counted.nodes == 0:
        return PendingReason.NO_NODES
    if counted.survivors == 0:
        # A job that asks for a GPU the cluster lacks hears that, rather than that some nodes are down; one whose
        # kind is there but held back from every placement (its queue's quota) hears that first.
        stopped: list[Filter] = [f for f in GROUP_FILTERS if f.match is Match.ANY and counted.counts[f.name]]
        stopped = stopped or [f for f in GROUP_FILTERS if counted.counts[f.name]]
        stopped = stopped or [f for f in IDENTITY if counted.counts[f.name]]
        return stopped[0].reason
    remaining = counted.free
    if remaining < k:
        return PendingReason.INSUFFICIENT_GPUS
    for f in CAPACITY:
        remaining -= counted.withheld[f.name]
        if remaining < k:
            return f.reason
    return (counted.gang or GANG_FILTERS[-1]).reason


def _potential(view: NodeView, job: Candidate) -> int:
    """Shards of ``job`` the node could take once everything on it ended."""
    memory = view.total_memory_bytes if view.total_memory_bytes >= 0 else view.free_memory_bytes
    cpu = view.total_cpu_cores if view.total_cpu_cores >= 0 else view.free_cpu_cores
    return shards(view.gpu_total, memory, cpu, job)


def reserve_for(index: ClusterIndex, job: Candidate) -> list[Slot]:
    """Hold the nodes ``job`` is closest to fitting on (most free GPUs first) until their GPUs could host it; the
    nodes held (none when even all of them could not host it).

    The nodes held for it in the cycle before come first while they can still host it: a reservation that moved to
    the nodes with the most free GPUs each cycle would follow the GPUs a preemption has just freed for another job
    and leave that job to preempt again elsewhere (seen in the simulator: one job preempted 781 gangs in this way,
    each time for nothing)."""
    potential = 0
    before = index.reserved_before.get(job.spec.job_id, frozenset())
    order = sorted(
        (slot.node_id not in before, -len(slot.free), step, slot.order, slot)
        for key in job.eligible
        for (step, _fc), bucket in index.groups[key].buckets.items()
        for slot in bucket.members()
        if could_host(slot, job)
    )
    plan: list[Slot] = []
    for _moved, _neg_free, _step, _order, slot in order:
        could = _potential(slot.view, job)
        if could <= 0:
            continue
        plan.append(slot)
        potential += could
        if potential >= job.k:
            for held in plan:
                index.reserve(held, job.spec.job_id)
            index.reserving[job.spec.job_id] = frozenset(held.node_id for held in plan)
            return plan
    return []
