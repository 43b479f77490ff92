"""The placement index kept from cycle to cycle, so a cycle's cost does not grow with idle nodes. Pure.

A :class:`~shardyard.placement.index.ClusterIndex` built afresh each cycle costs a slot per node: at 10,000 nodes,
most of a cycle. The standing index is built once and then told what changed: ``update`` files a node's new view
(its state changed, or the gangs on it did) and ``remove`` drops a node, each at the cost of that node. A cycle
works on it as on a fresh index, between ``begin`` and ``rollback``: every slot the cycle changes (admitting gangs,
reserving nodes) is saved the first time it is touched, and ``rollback`` puts each back as it was. The cycle's
decisions then come back as facts (the gangs it placed), and through ``update`` they change the nodes they
changed, for good.

Nodes filed after the index was built go to their bucket's arrivals, in order; a bucket whose arrivals and departed
slots outweigh its indexed ones is compacted (its members sorted into one list again), so walks stay short.
"""

import bisect
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from shardyard.events import JobSpec
from shardyard.placement.index import Bucket, ClusterIndex, Group, Slot
from shardyard.placement.model import NodeView, Policy


@dataclass
class _Saved:
    """A slot as it was before the cycle touched it."""

    free: list[int]
    memory: int
    cpu: float
    ports: list[int]
    bucket: Bucket | None
    arrived: bool
    cached_in: list[list[Slot]]
    held_by: str | None


@dataclass
class _GroupSaved:
    """A group's tallies as they were before the cycle touched it."""

    free_gpus: int
    held: dict[str, int]
    held_free: dict[str, int]


class StandingIndex(ClusterIndex):
    def __init__(self, nodes: Iterable[NodeView] = (), policy: Policy | None = None) -> None:
        super().__init__(nodes, policy or Policy())
        self.free_counts: Counter[int] = Counter(len(slot.free) for slot in self.slots.values())
        self.with_topology = sum(1 for slot in self.slots.values() if slot.zone or slot.rack)
        """Nodes with a zone or rack label: while there are none, placement skips topology ranking."""
        self._saved: dict[str, _Saved] | None = None
        self._groups_saved: dict[int, tuple[Group, _GroupSaved]] = {}

    # --- what changed between cycles -------------------------------------------------------------------------
    def update(self, view: NodeView) -> None:
        """File ``view`` as its node's view from now on."""
        assert self._saved is None, "update between cycles, not during one"
        self.remove(view.node_id)
        slot = self._add(view, arriving=True)
        self.free_counts[len(slot.free)] += 1
        self.with_topology += bool(slot.zone or slot.rack)
        if slot.bucket is not None:
            self._compact(slot.bucket)

    def remove(self, node_id: str) -> None:
        """Forget a node (its state went, or it has no GPUs any more)."""
        slot = self.slots.pop(node_id, None)
        if slot is None:
            return
        self.free_counts[len(slot.free)] -= 1
        self.with_topology -= bool(slot.zone or slot.rack)
        if slot.bucket is not None:
            bucket = slot.bucket
            self._unfile(slot)
            self._uncache(slot)
            self._compact(bucket)
        else:
            self._release(slot)

    def _compact(self, bucket: Bucket) -> None:
        """Sort a bucket's members into one indexed list again once departed slots and arrivals outweigh it."""
        if len(bucket.indexed) + len(bucket.arrivals) <= 2 * max(bucket.count, 8):
            return
        members = list(bucket.members())
        for slot in members:
            slot.arrived = False
        bucket.indexed, bucket.arrivals, bucket.start = members, [], 0

    # --- one cycle -------------------------------------------------------------------------------------------
    def begin(self) -> None:
        """A cycle starts: from now on, what it changes is saved to be rolled back."""
        self._saved, self._groups_saved = {}, {}
        self.reserving, self.claiming, self.held_claims = {}, {}, {}
        self.max_free = max((free for free, count in self.free_counts.items() if count > 0), default=0)

    def rollback(self) -> None:
        """The cycle is over: every slot it touched, and every group's tallies, as they were at ``begin``."""
        saved, self._saved = self._saved or {}, None
        self.reserved_before, self.reserving = self.reserving, {}  # outlives the cycle: reservations stay put
        self.claimed_before, self.claiming, self.held_claims = self.claiming, {}, {}  # and claims (``claims``)
        for node_id, before in saved.items():
            slot = self.slots[node_id]
            self._unfile(slot)
            self._uncache(slot)
            slot.free, slot.memory, slot.cpu, slot.ports = before.free, before.memory, before.cpu, before.ports
            slot.reserved_for, slot.held_by = None, before.held_by
            self._restore(slot, before)
        for group, tallies in self._groups_saved.values():
            group.free_gpus, group.held, group.held_free = tallies.free_gpus, tallies.held, tallies.held_free
        self._groups_saved = {}

    def _restore(self, slot: Slot, before: _Saved) -> None:
        bucket = before.bucket
        if bucket is not None:
            if before.arrived:
                bisect.insort(bucket.arrivals, slot, key=_order_of)
                slot.arrived = True
            else:  # it is still in the bucket's indexed list, where it was: a walk must not have passed it
                bucket.start = min(bucket.start, bisect.bisect_left(bucket.indexed, slot.order, key=_order_of))
            bucket.count += 1
            slot.bucket = bucket
        for cached in before.cached_in:
            bisect.insort(cached, slot, key=_order_of)
        slot.cached_in = list(before.cached_in)

    def _save(self, slot: Slot) -> None:
        saved = self._saved
        if saved is None or slot.node_id in saved:
            return
        saved[slot.node_id] = _Saved(
            list(slot.free),
            slot.memory,
            slot.cpu,
            list(slot.ports),
            slot.bucket,
            slot.arrived,
            list(slot.cached_in),
            slot.held_by,
        )
        group = slot.group
        if id(group) not in self._groups_saved:
            tallies = _GroupSaved(group.free_gpus, dict(group.held), dict(group.held_free))
            self._groups_saved[id(group)] = (group, tallies)

    def take(self, slot: Slot, gpus: list[int], spec: JobSpec, *, coordinator: bool) -> None:
        self._save(slot)
        super().take(slot, gpus, spec, coordinator=coordinator)

    def reserve(self, slot: Slot, job_id: str) -> None:
        self._save(slot)
        super().reserve(slot, job_id)

    def unreserve(self, slot: Slot) -> None:
        self._save(slot)
        super().unreserve(slot)


def _order_of(slot: Slot) -> tuple[float, str]:
    return slot.order
