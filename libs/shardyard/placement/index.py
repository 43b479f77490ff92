"""The cycle's working copy of the snapshot, indexed so that one decision costs the same at 100 or 10,000 nodes.

Nodes are grouped by (GPU model, TFLOPS); inside a group, the nodes that can take work are bucketed by
(load step, free GPUs), each bucket in load order. A decision walks buckets in rank order and touches only the nodes
it needs, plus a bounded window of equally ranked ones (and any it passes over because they fail one of the job's
own checks: excluded, memory, CPU, artifacts).

What a decision costs does not grow with the number of nodes:

- a bucket keeps the nodes filed when the cycle began in one list, sorted once at indexing; a node that leaves is
  only marked gone (its slot names another bucket), and a walk steps over the gone ones at the front once, for good;
- nodes that arrive during the cycle (fewer free GPUs after a placement) go to the bucket's list of arrivals, which
  is never longer than the number of placements made so far;
- the lists of nodes holding an artifact on local disk hold only nodes that can take a shard now, as slots;
- a slot carries what a walk and a placement read (free GPUs, load, id, topology), so a decision reads one object
  per node, not the node's view as well.

Which nodes are filed in the buckets is the state filters' doing (``filters``): a node that fails one is held out of
them and tallied per group under that filter. "Why not" counts (``contention.explain``) come from those tallies plus
a scan of the usable nodes.
"""

import bisect
import posixpath
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from shardyard.events import JobSpec
from shardyard.gpus import canonical_model
from shardyard.placement.filters import RESERVED, STATE_FILTERS, Wants, shards, state_failing
from shardyard.placement.model import NodeView, Policy


def norm_path(path: str) -> str:
    return posixpath.normpath(path) if path else path


class Slot:
    """One node's free resources, updated as the cycle admits gangs and makes reservations."""

    __slots__ = (
        "arrived",
        "artifacts",
        "bucket",
        "cached_in",
        "cpu",
        "free",
        "gpu_model",
        "group",
        "held_by",
        "load",
        "load_rank",
        "memory",
        "node_id",
        "order",
        "ports",
        "rack",
        "reserved_for",
        "view",
        "zone",
    )

    def __init__(self, view: NodeView, group: "Group", load_rank: int, artifacts: Mapping[str, str]) -> None:
        self.view = view
        self.node_id = view.node_id
        self.gpu_model = view.gpu_model
        self.load = view.cpu_load
        self.zone = view.zone
        self.rack = view.rack
        self.artifacts = artifacts
        self.group = group
        self.free = list(view.free_gpus)
        self.memory = view.free_memory_bytes
        self.cpu = view.free_cpu_cores
        self.ports = list(view.rendezvous_ports)
        self.load_rank = load_rank
        self.order: tuple[float, str] = (view.cpu_load, view.node_id)
        """Position in (load, node id) order over the whole cluster."""
        self.reserved_for: str | None = None
        self.held_by: str | None = None
        """The state filter the node failed, which holds it out of the buckets (None: filed in one)."""
        self.bucket: Bucket | None = None
        self.arrived = False
        """Filed in its bucket's arrivals (during the cycle) rather than among the nodes indexed at its start."""
        self.cached_in: list[list[Slot]] = []
        """The index's lists of nodes holding an artifact locally that this node is in; it leaves them when it can
        take no more shards this cycle."""

    def capacity(self, job: Wants) -> int:
        """Shards of ``job`` this node can take now."""
        return shards(len(self.free), self.memory, self.cpu, job)

    def locality(self, model_path: str, dataset_path: str) -> int:
        artifacts = self.artifacts
        return (artifacts.get(model_path) == "local") + (artifacts.get(dataset_path) == "local")


_order = attrgetter("order")


class Bucket:
    """The usable nodes of one group with the same (load step, free GPUs), iterated in (load, node id) order.

    ``indexed`` holds the nodes filed when the cycle began, sorted once; one that leaves stays in the list, gone
    (its slot's bucket is another), and ``start`` moves past the gone ones at the front. ``arrivals`` holds the
    nodes filed since, kept sorted: they came from a placement, so there are at most as many as placements so far.
    Neither filing nor unfiling a node costs more with more nodes in the bucket.
    """

    __slots__ = ("arrivals", "count", "indexed", "start")

    def __init__(self) -> None:
        self.indexed: list[Slot] = []
        self.start = 0
        self.arrivals: list[Slot] = []
        self.count = 0
        """Nodes in the bucket now."""

    def members(self) -> Iterator[Slot]:
        """The nodes in the bucket, in (load, node id) order."""
        indexed, arrivals = self.indexed, self.arrivals
        i, end = self.start, len(indexed)
        # A slot that left and came back (a reservation given back for backfill) is among the arrivals: not here.
        while i < end and (indexed[i].bucket is not self or indexed[i].arrived):
            i += 1
        self.start = i
        j, arrived = 0, len(arrivals)
        while i < end:
            slot = indexed[i]
            if slot.bucket is not self or slot.arrived:
                i += 1
            elif j < arrived and arrivals[j].order < slot.order:
                yield arrivals[j]
                j += 1
            else:
                yield slot
                i += 1
        while j < arrived:
            yield arrivals[j]
            j += 1


def _per_state_filter() -> dict[str, int]:
    return dict.fromkeys((f.name for f in STATE_FILTERS), 0)


@dataclass
class Group:
    """The nodes of one GPU model and TFLOPS figure."""

    model: str
    tflops: float
    held: dict[str, int] = field(default_factory=_per_state_filter)
    """State filter name -> the nodes held out of the buckets by it (dead, draining, overloaded, reserved)."""
    held_free: dict[str, int] = field(default_factory=_per_state_filter)
    """State filter name -> the free GPUs of those nodes."""
    buckets: dict[tuple[int, int], Bucket] = field(default_factory=dict)
    """(load step, free GPUs) -> the nodes that can take work (0 free included)."""
    free_gpus: int = 0

    @property
    def reserved(self) -> int:
        return self.held[RESERVED]

    @property
    def reserved_free(self) -> int:
        return self.held_free[RESERVED]

    def nodes_total(self) -> int:
        usable = sum(bucket.count for bucket in self.buckets.values())
        return sum(self.held.values()) + usable


class ClusterIndex:
    def __init__(self, nodes: Iterable[NodeView], policy: Policy) -> None:
        self.policy = policy
        self.load_steps = max(1, int(policy.load_threshold / policy.load_step + 0.999999))
        self.slots: dict[str, Slot] = {}
        self.groups: dict[tuple[str, float], Group] = {}
        self.local: dict[str, dict[tuple[str, float, int], list[Slot]]] = {}
        """Artifact path -> (model, TFLOPS, load step) -> the usable nodes with free GPUs that hold it on local
        disk, in indexing order (by load). A node leaves these lists when it fills up or is reserved, so a walk
        never steps over the nodes of a busy cluster that cannot take a shard."""
        self.max_free = 0
        self.reserved_before: Mapping[str, frozenset[str]] = {}
        """Job id -> the nodes a reservation (``contention.reserve_for``) held for it in the cycle before: a standing
        index's; empty for an index of one cycle."""
        self.reserving: dict[str, frozenset[str]] = {}
        """Job id -> the nodes a reservation holds for it in this cycle (``reserved_before`` in the next)."""
        self.claimed_before: Mapping[str, tuple[frozenset[str], frozenset[str]]] = {}
        """Preemptor's job id -> its victims and their nodes, as held for it in the cycle before
        (``placement.claims``)."""
        self.claiming: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
        """The same, in this cycle (``claimed_before`` in the next)."""
        self.held_claims: dict[str, list[Slot]] = {}
        """Job id -> the nodes held for it since this cycle's start (``claims.hold``), until its turn."""
        self._artifact_sets: dict[frozenset[tuple[str, str]], Mapping[str, str]] = {}
        # Slots are created in the order decisions walk them (group, then load), so a walk reads memory mostly in
        # sequence.
        walked = sorted(nodes, key=lambda v: (v.gpu_model, v.tflops, v.cpu_load, v.node_id))
        for view in walked:
            self._add(view)
        for group in self.groups.values():
            for bucket in group.buckets.values():
                bucket.indexed.sort(key=_order)  # already in order unless model names differ only in spelling

    def _add(self, view: NodeView, *, arriving: bool = False) -> Slot:
        """File a node's slot. At indexing, slots come in walk order and are appended (then sorted once); a node
        ``arriving`` later (:class:`~shardyard.placement.standing.StandingIndex`) is inserted in order."""
        model = canonical_model(view.gpu_model)
        group = self.groups.get((model, view.tflops))
        if group is None:
            group = self.groups[(model, view.tflops)] = Group(model, view.tflops)
        load_rank = int(view.cpu_load / self.policy.load_step) if self.policy.load_step > 0 else 0
        slot = Slot(view, group, load_rank, self._interned(view.artifacts))
        self.slots[view.node_id] = slot
        held = state_failing(slot, self.policy)
        if held is not None:
            self._hold(slot, held.name)
        elif arriving:
            self._refile(slot)
            self._cache(slot, arriving=True)
        else:
            bucket = self._bucket(slot)
            bucket.indexed.append(slot)
            bucket.count += 1
            slot.bucket = bucket
            group.free_gpus += len(slot.free)
            self._cache(slot)
        self.max_free = max(self.max_free, len(slot.free))
        return slot

    def _cache(self, slot: Slot, *, arriving: bool = False) -> None:
        """File a usable slot with free GPUs in the lists of the artifacts it holds on local disk."""
        if not slot.free:
            return
        artifacts = slot.view.artifacts
        group = slot.group
        for path in dict.fromkeys(norm_path(path) for path, place in artifacts.items() if place == "local"):
            cached = self.local.setdefault(path, {}).setdefault((group.model, group.tflops, slot.load_rank), [])
            if arriving:
                bisect.insort(cached, slot, key=_order)
            else:
                cached.append(slot)
            slot.cached_in.append(cached)

    def _interned(self, artifacts: Mapping[str, str]) -> Mapping[str, str]:
        """One shared map per distinct artifact set (most nodes see the same shared paths): a decision's artifact
        checks then read a few hot maps instead of one cold map per node."""
        key = frozenset(artifacts.items())
        shared = self._artifact_sets.get(key)
        if shared is None:
            shared = self._artifact_sets[key] = {norm_path(path): place for path, place in artifacts.items()}
        return shared

    # --- bucket maintenance ------------------------------------------------------------------------------------
    def _hold(self, slot: Slot, name: str) -> None:
        """Tally ``slot``, out of any bucket, under the state filter ``name`` it fails."""
        slot.held_by = name
        slot.group.held[name] += 1
        slot.group.held_free[name] += len(slot.free)

    def _release(self, slot: Slot) -> None:
        """Take a held ``slot`` off its group's tallies."""
        if slot.held_by is not None:
            slot.group.held[slot.held_by] -= 1
            slot.group.held_free[slot.held_by] -= len(slot.free)
            slot.held_by = None

    def _bucket(self, slot: Slot) -> Bucket:
        """The bucket ``slot`` belongs in now (created the first time a node belongs in it)."""
        key = (slot.load_rank, len(slot.free))
        bucket = slot.group.buckets.get(key)
        if bucket is None:
            bucket = slot.group.buckets[key] = Bucket()
        return bucket

    def _unfile(self, slot: Slot) -> None:
        """Take ``slot`` out of its bucket: gone from the indexed list, removed from the arrivals."""
        bucket = slot.bucket
        if bucket is None:
            return
        if slot.arrived:
            arrivals = bucket.arrivals
            del arrivals[bisect.bisect_left(arrivals, slot.order, key=_order)]
            slot.arrived = False
        bucket.count -= 1
        slot.bucket = None
        slot.group.free_gpus -= len(slot.free)

    def _refile(self, slot: Slot) -> None:
        """File ``slot``, out of any bucket, among the arrivals of the bucket it now belongs in."""
        bucket = self._bucket(slot)
        bisect.insort(bucket.arrivals, slot, key=_order)
        bucket.count += 1
        slot.bucket = bucket
        slot.arrived = True
        slot.group.free_gpus += len(slot.free)

    def _uncache(self, slot: Slot) -> None:
        """Drop ``slot`` from the lists of nodes holding an artifact locally: it can take no shard this cycle."""
        for cached in slot.cached_in:
            cached.remove(slot)
        slot.cached_in.clear()

    def take(self, slot: Slot, gpus: list[int], spec: JobSpec, *, coordinator: bool) -> None:
        """Admit shards of ``spec`` on ``gpus`` of ``slot`` (and a rendezvous port when it coordinates)."""
        taken = set(gpus)
        free = [g for g in slot.free if g not in taken]
        if slot.bucket is not None and len(free) != len(slot.free):
            self._unfile(slot)
            slot.free = free
            self._refile(slot)
        else:
            slot.free = free
        slot.memory -= spec.memory_per_shard * len(gpus)
        slot.cpu -= spec.cpu_per_shard * len(gpus)
        if coordinator and slot.ports:
            slot.ports.pop(0)
        if not slot.free:
            self._uncache(slot)

    def reserve(self, slot: Slot, job_id: str) -> None:
        """Hold ``slot`` for ``job_id``: lower-ranked jobs of this cycle may not use it."""
        if slot.reserved_for is not None or slot.bucket is None:
            return
        self._unfile(slot)
        self._uncache(slot)
        slot.reserved_for = job_id
        self._hold(slot, RESERVED)  # the one state filter it now fails: it passed the others to be in a bucket

    def unreserve(self, slot: Slot) -> None:
        """Give a reserved ``slot`` back to the walk: a job expected to end before the reservation starts may
        backfill onto it (``reserve`` holds it again afterwards)."""
        if slot.reserved_for is None:
            return
        self._release(slot)
        slot.reserved_for = None
        self._refile(slot)
        self._cache(slot, arriving=True)

    def usable(self, slot: Slot) -> bool:
        return slot.bucket is not None

    def local_nodes(self, path: str, group: Group, load_rank: int) -> list[Slot]:
        """Usable nodes of ``group`` at ``load_rank`` with free GPUs that hold ``path`` on local disk."""
        return self.local.get(path, {}).get((group.model, group.tflops, load_rank), [])
