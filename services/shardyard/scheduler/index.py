"""The cycle's working copy of the snapshot, indexed so that one decision costs the same at 100 or 10,000 nodes.

Nodes are grouped by (GPU model, TFLOPS); inside a group, the nodes that can take work are bucketed by
(load step, free GPUs) and kept sorted by load. A decision walks buckets in rank order and touches only the nodes it
needs, plus a bounded window of equally ranked ones; "why not" counts come from per-group tallies plus a scan of the
few nodes that have free GPUs but fail a per-job check (memory, CPU, artifacts).
"""

import bisect
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shardyard.events import JobSpec, NodeStatus
from shardyard.gpus import canonical_model
from shardyard.scheduler.model import NodeView, Policy


def norm_path(path: str) -> str:
    return posixpath.normpath(path) if path else path


class Slot:
    """One node's free resources, updated as the cycle admits gangs and makes reservations."""

    __slots__ = ("artifacts", "bucket", "cpu", "free", "group", "load_rank", "memory", "ports", "reserved_for", "view")

    def __init__(self, view: NodeView, group: "Group", load_rank: int, artifacts: Mapping[str, str]) -> None:
        self.view = view
        self.artifacts = artifacts
        self.group = group
        self.free = list(view.free_gpus)
        self.memory = view.free_memory_bytes
        self.cpu = view.free_cpu_cores
        self.ports = list(view.rendezvous_ports)
        self.load_rank = load_rank
        self.reserved_for: str | None = None
        self.bucket: tuple[int, int] | None = None

    @property
    def node_id(self) -> str:
        return self.view.node_id

    def capacity(self, spec: JobSpec) -> int:
        """Shards of ``spec`` this node can take now."""
        count = len(self.free)
        if spec.memory_per_shard:
            count = min(count, self.memory // spec.memory_per_shard)
        if spec.cpu_per_shard:
            count = min(count, int(self.cpu / spec.cpu_per_shard + 1e-9))
        return count

    def has_artifacts(self, model_path: str, dataset_path: str) -> bool:
        artifacts = self.artifacts
        return model_path in artifacts and dataset_path in artifacts

    def locality(self, model_path: str, dataset_path: str) -> int:
        artifacts = self.artifacts
        return (artifacts.get(model_path) == "local") + (artifacts.get(dataset_path) == "local")


@dataclass
class Group:
    """The nodes of one GPU model and TFLOPS figure."""

    model: str
    tflops: float
    dead: int = 0
    draining: int = 0
    overloaded: int = 0
    overloaded_free: int = 0
    reserved: int = 0
    reserved_free: int = 0
    buckets: dict[tuple[int, int], list[tuple[float, str, "Slot"]]] = field(default_factory=dict)
    """(load step, free GPUs) -> (load, node id, slot) sorted by load, of nodes that can take work (0 free
    included). The slot rides along so a walk needs no lookup by id."""
    free_gpus: int = 0

    def nodes_total(self) -> int:
        usable = sum(len(entries) for entries in self.buckets.values())
        return self.dead + self.draining + self.overloaded + self.reserved + usable


class ClusterIndex:
    def __init__(self, nodes: Iterable[NodeView], policy: Policy) -> None:
        self.policy = policy
        self.load_steps = max(1, int(policy.load_threshold / policy.load_step + 0.999999))
        self.slots: dict[str, Slot] = {}
        self.groups: dict[tuple[str, float], Group] = {}
        self.local: dict[str, dict[tuple[str, float, int], list[str]]] = {}
        """Artifact path -> (model, TFLOPS, load step) -> nodes that hold it on local disk."""
        self.max_free = 0
        self._artifact_sets: dict[frozenset[tuple[str, str]], Mapping[str, str]] = {}
        # Slots are created in the order decisions walk them (group, then load), so a walk reads memory mostly in
        # sequence; at 10,000 nodes this keeps a decision as fast as at 100.
        for view in sorted(nodes, key=lambda v: (v.gpu_model, v.tflops, v.cpu_load, v.node_id)):
            self._add(view)

    def _add(self, view: NodeView) -> None:
        model = canonical_model(view.gpu_model)
        group = self.groups.get((model, view.tflops))
        if group is None:
            group = self.groups[(model, view.tflops)] = Group(model, view.tflops)
        load_rank = int(view.cpu_load / self.policy.load_step) if self.policy.load_step > 0 else 0
        slot = Slot(view, group, load_rank, self._interned(view.artifacts))
        self.slots[view.node_id] = slot
        for path, place in view.artifacts.items():
            if place == "local":
                where = (model, view.tflops, load_rank)
                self.local.setdefault(norm_path(path), {}).setdefault(where, []).append(view.node_id)
        if view.status is not NodeStatus.ALIVE:
            group.dead += 1
        elif view.draining:
            group.draining += 1
        elif view.cpu_load >= self.policy.load_threshold:
            group.overloaded += 1
            group.overloaded_free += len(slot.free)
        else:
            self._file(slot)
        self.max_free = max(self.max_free, len(slot.free))

    def _interned(self, artifacts: Mapping[str, str]) -> Mapping[str, str]:
        """One shared map per distinct artifact set (most nodes see the same shared paths): a decision's artifact
        checks then read a few hot maps instead of one cold map per node, which kept 10,000 nodes as fast as 100."""
        key = frozenset(artifacts.items())
        shared = self._artifact_sets.get(key)
        if shared is None:
            shared = self._artifact_sets[key] = {norm_path(path): place for path, place in artifacts.items()}
        return shared

    # --- bucket maintenance ------------------------------------------------------------------------------------
    def _file(self, slot: Slot) -> None:
        key = (slot.load_rank, len(slot.free))
        entries = slot.group.buckets.setdefault(key, [])
        bisect.insort(entries, (slot.view.cpu_load, slot.node_id, slot))
        slot.bucket = key
        slot.group.free_gpus += len(slot.free)

    def _unfile(self, slot: Slot) -> None:
        if slot.bucket is None:
            return
        entries = slot.group.buckets[slot.bucket]
        at = bisect.bisect_left(entries, (slot.view.cpu_load, slot.node_id))
        if at < len(entries) and entries[at][2] is slot:
            del entries[at]
        slot.bucket = None
        slot.group.free_gpus -= len(slot.free)

    def take(self, slot: Slot, gpus: list[int], spec: JobSpec, *, coordinator: bool) -> None:
        """Admit shards of ``spec`` on ``gpus`` of ``slot`` (and a rendezvous port when it coordinates)."""
        filed = slot.bucket is not None
        if filed:
            self._unfile(slot)
        taken = set(gpus)
        slot.free = [g for g in slot.free if g not in taken]
        slot.memory -= spec.memory_per_shard * len(gpus)
        slot.cpu -= spec.cpu_per_shard * len(gpus)
        if coordinator and slot.ports:
            slot.ports.pop(0)
        if filed:
            self._file(slot)

    def reserve(self, slot: Slot, job_id: str) -> None:
        """Hold ``slot`` for ``job_id``: lower-ranked jobs of this cycle may not use it."""
        if slot.reserved_for is not None or slot.bucket is None:
            return
        self._unfile(slot)
        slot.reserved_for = job_id
        slot.group.reserved += 1
        slot.group.reserved_free += len(slot.free)

    def usable(self, slot: Slot) -> bool:
        return slot.bucket is not None

    def local_nodes(self, path: str, group: Group, load_rank: int) -> list[str]:
        """Nodes of ``group`` at ``load_rank`` that hold ``path`` on local disk."""
        return self.local.get(path, {}).get((group.model, group.tflops, load_rank), [])
