"""The autoscaler's view of the nodes it manages and of the backlog's demand, and its decisions. Pure: time comes in.

Facts come in through ``adopt`` (what the provider manages, at start and on each tick), ``on_added`` /
``on_removed`` (what the provider did), ``on_capacity`` / ``on_reclaim`` (the scheduler's signals on
``shardyard.elasticity``) and ``on_node_state`` (``shardyard.nodes.state``). ``decide(now)`` returns what to do, in
numbered phases, and records it (a node being drained or removed is not decided again):

1. **Clean up**: a node that never came ALIVE within ``join_timeout_s``, or that was lost, is removed.
2. **Undrain**: a draining node of a model fresh requests ask for again is kept (undrained), cooldown or not:
   demand that returns is served by the nodes still there before any is added. An undrain the pool does not show
   yet is sent again.
3. **Finish drains**: a draining node that is idle is removed; a drain the pool has not shown yet is sent again.
4. **Scale up** (outside the cooldown, and not when a node was just undrained): for each allowed model, the GPUs
   fresh capacity requests ask for, less the GPUs of its nodes still joining (pending capacity: a repeated request
   adds nothing while they join), in whole nodes, within ``max_nodes``.
5. **Scale down** (outside the cooldown): a node the scheduler reported idle (``ReclaimCandidate``), idle since,
   older than ``min_lifetime_s``, of a model nothing waits for, is drained, never below ``min_nodes``.

Node lifecycle (``TRANSITIONS``): JOINING -> ALIVE -> DRAINING -> REMOVING -> gone; JOINING and ALIVE may go to
REMOVING directly (join timeout, lost)."""

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from shardyard.autoscale.provider import ProvidedNode
from shardyard.events import CapacityRequested, NodeState, NodeStatus, ReclaimCandidate
from shardyard.gpus import canonical_model

ANY_MODEL = "ANY"
SLACK = timedelta(seconds=1)
"""A node state this much older than the node's addition is still its own (a clock's second, rounded)."""


class Phase(StrEnum):
    JOINING = "JOINING"
    ALIVE = "ALIVE"
    DRAINING = "DRAINING"
    REMOVING = "REMOVING"


TRANSITIONS: Mapping[Phase, frozenset[Phase]] = {
    # asked for: ALIVE once its agent reports; removed if it does not within the join timeout
    Phase.JOINING: frozenset({Phase.ALIVE, Phase.REMOVING}),
    # drained once idle past its lifetime; removed at once when lost
    Phase.ALIVE: frozenset({Phase.DRAINING, Phase.REMOVING}),
    # removed once the pool shows it draining and idle; ALIVE again (undrained) when demand for its model returns
    Phase.DRAINING: frozenset({Phase.REMOVING, Phase.ALIVE}),
    # a removal that failed is tried again from where it was
    Phase.REMOVING: frozenset({Phase.JOINING, Phase.ALIVE, Phase.DRAINING}),
}


class RemoveReason(StrEnum):
    IDLE = "IDLE"
    JOIN_TIMEOUT = "JOIN_TIMEOUT"
    LOST = "LOST"


@dataclass(frozen=True)
class AutoscalePolicy:
    node_gpus: Mapping[str, int]
    """Allowed GPU models, in order of preference for a request of ANY model, and the GPUs of a node of each."""
    max_nodes: int
    min_nodes: int = 0
    cooldown_s: float = 60.0
    min_lifetime_s: float = 300.0
    join_timeout_s: float = 180.0
    demand_ttl_s: float = 120.0
    """A capacity request older than this is stale (the scheduler repeats one that lasts every 30 s)."""
    drain_retry_s: float = 10.0
    tflops: Mapping[str, float] = field(default_factory=dict)
    """Catalogue TFLOPS per model: a request of ANY model with a floor takes an allowed model that reaches it."""


@dataclass(frozen=True)
class Add:
    gpu_model: str
    gpus_per_node: int
    count: int
    jobs: tuple[str, ...]


@dataclass(frozen=True)
class Drain:
    node_id: str


@dataclass(frozen=True)
class Undrain:
    node_id: str


@dataclass(frozen=True)
class Remove:
    node_id: str
    reason: RemoveReason


Action = Add | Drain | Undrain | Remove


@dataclass
class Managed:
    node_id: str
    gpu_model: str
    gpus: int
    added_at: datetime
    phase: Phase = Phase.JOINING
    before_removing: Phase = Phase.JOINING
    alive_at: datetime | None = None
    busy_at: datetime | None = None
    """When its state last showed GPUs allocated or shards running."""
    idle: bool = True
    reclaimable_at: datetime | None = None
    """When the scheduler last reported it idle with nothing waiting for it."""
    lost: bool = False
    draining_seen: bool = False
    drain_sent_at: datetime | None = None
    undrain_sent_at: datetime | None = None
    retry_at: datetime | None = None
    """A failed removal is tried again from then."""

    def move(self, phase: Phase) -> None:
        assert phase in TRANSITIONS[self.phase], f"{self.node_id}: {self.phase} -> {phase}"
        if phase is Phase.REMOVING:
            self.before_removing = self.phase
        self.phase = phase


@dataclass
class AutoscaleBook:
    policy: AutoscalePolicy
    nodes: dict[str, Managed] = field(default_factory=dict)
    demand: dict[tuple[str, float], CapacityRequested] = field(default_factory=dict)
    last_action_at: datetime | None = None
    joined_at: dict[str, datetime] = field(default_factory=dict)
    """Per model: when a node of it last came ALIVE. A request from before then was answered (or is being)."""

    # Facts ----------------------------------------------------------------------------------------------------------

    def adopt(self, provided: Iterable[ProvidedNode]) -> list[Managed]:
        """What the provider manages: nodes not known yet are taken as joining (their state, followed, says more);
        known ones it no longer has (an agent that died) are forgotten. Returns the forgotten."""
        seen = {node.node_id: node for node in provided}
        for node in seen.values():
            if node.node_id not in self.nodes:
                added = datetime.fromtimestamp(node.added_at, UTC)
                self.nodes[node.node_id] = Managed(node.node_id, canonical_model(node.gpu_model), node.gpus, added)
        gone = [m for n, m in self.nodes.items() if n not in seen and m.phase is not Phase.REMOVING]
        for lost in gone:
            del self.nodes[lost.node_id]
        return gone

    def on_added(self, node_ids: Iterable[str], gpu_model: str, gpus: int, now: datetime) -> None:
        for node_id in node_ids:
            self.nodes[node_id] = Managed(node_id, canonical_model(gpu_model), gpus, now)

    def on_removed(self, node_id: str) -> None:
        self.nodes.pop(node_id, None)

    def on_remove_failed(self, node_id: str, now: datetime) -> None:
        node = self.nodes.get(node_id)
        if node is not None and node.phase is Phase.REMOVING:
            node.move(node.before_removing)
            node.retry_at = now + timedelta(seconds=self.policy.cooldown_s)

    def on_capacity(self, request: CapacityRequested) -> None:
        kind = (canonical_model(request.gpu_model), request.min_tflops)
        last = self.demand.get(kind)
        if last is None or request.occurred_at >= last.occurred_at:
            self.demand[kind] = request

    def on_reclaim(self, candidate: ReclaimCandidate) -> None:
        node = self.nodes.get(candidate.node_id)
        if node is None or candidate.occurred_at < node.added_at:
            return  # not ours, or about an earlier node of that name
        if node.reclaimable_at is None or candidate.occurred_at > node.reclaimable_at:
            node.reclaimable_at = candidate.occurred_at

    def on_node_state(self, state: NodeState) -> None:
        node = self.nodes.get(state.node_id)
        if node is None or state.occurred_at < node.added_at - SLACK:
            return  # not ours, or the state of an earlier node of that name
        node.lost = state.status is NodeStatus.LOST
        node.draining_seen = state.draining
        node.idle = not state.allocated_gpus and not state.running
        if not node.idle and (node.busy_at is None or state.occurred_at > node.busy_at):
            node.busy_at = state.occurred_at
        if state.status is NodeStatus.ALIVE and node.phase is Phase.JOINING:
            node.move(Phase.ALIVE)
            node.alive_at = state.occurred_at
            last = self.joined_at.get(node.gpu_model)
            self.joined_at[node.gpu_model] = state.occurred_at if last is None else max(last, state.occurred_at)

    # Decisions ------------------------------------------------------------------------------------------------------

    def decide(self, now: datetime) -> list[Action]:
        actions: list[Action] = []
        actions += self._clean_up(now)  # 1
        undrained = self._undrain(now)  # 2
        actions += undrained
        actions += self._finish_drains(now)  # 3
        if not self._cooling(now) and not undrained:
            scaled = self._scale_up(now) or self._scale_down(now)  # 4, 5: one scale action per cooldown
            if scaled:
                self.last_action_at = now
            actions += scaled
        return actions

    def _clean_up(self, now: datetime) -> list[Action]:
        out: list[Action] = []
        for node in self._settled(now):
            late = node.phase is Phase.JOINING and now - node.added_at > timedelta(seconds=self.policy.join_timeout_s)
            if late or (node.lost and node.phase in (Phase.ALIVE, Phase.DRAINING)):
                node.move(Phase.REMOVING)
                out.append(Remove(node.node_id, RemoveReason.JOIN_TIMEOUT if late else RemoveReason.LOST))
        return out

    def _undrain(self, now: datetime) -> list[Action]:
        wanted, retry = self.wanted(now), timedelta(seconds=self.policy.drain_retry_s)
        out: list[Action] = []
        for node in self._settled(now):
            kept = node.phase is Phase.DRAINING and node.gpu_model in wanted
            sent = node.undrain_sent_at
            unseen = sent is not None and node.phase is Phase.ALIVE and node.draining_seen and now - sent >= retry
            if kept:  # like a node that came ALIVE: the requests until now are being answered by it
                node.move(Phase.ALIVE)
                last = self.joined_at.get(node.gpu_model)
                self.joined_at[node.gpu_model] = now if last is None else max(last, now)
            if kept or unseen:
                node.drain_sent_at, node.undrain_sent_at = None, now
                out.append(Undrain(node.node_id))
        return out

    def _finish_drains(self, now: datetime) -> list[Action]:
        out: list[Action] = []
        for node in self._settled(now):
            if node.phase is not Phase.DRAINING:
                continue
            if node.draining_seen and node.idle:
                node.move(Phase.REMOVING)
                out.append(Remove(node.node_id, RemoveReason.IDLE))
            elif not node.draining_seen and (
                node.drain_sent_at is None or now - node.drain_sent_at >= timedelta(seconds=self.policy.drain_retry_s)
            ):
                node.drain_sent_at = now
                out.append(Drain(node.node_id))
        return out

    def _scale_up(self, now: datetime) -> list[Action]:
        out: list[Action] = []
        room = self.policy.max_nodes - len(self.nodes)
        for model, (gpus, jobs) in sorted(self.wanted(now).items()):
            per_node = self.policy.node_gpus[model]
            pending = sum(n.gpus for n in self.nodes.values() if n.gpu_model == model and n.phase is Phase.JOINING)
            count = min(math.ceil(max(0, gpus - pending) / per_node), room)
            if count > 0:
                room -= count
                out.append(Add(model, per_node, count, jobs))
        return out

    def _scale_down(self, now: datetime) -> list[Action]:
        wanted = self.wanted(now)
        lifetime = timedelta(seconds=self.policy.min_lifetime_s)
        staying = sum(1 for n in self.nodes.values() if n.phase in (Phase.JOINING, Phase.ALIVE))
        out: list[Action] = []
        for node in sorted(self.nodes.values(), key=lambda n: n.added_at):
            if staying <= self.policy.min_nodes:
                break
            reclaimable = node.reclaimable_at is not None and (
                node.busy_at is None or node.reclaimable_at > node.busy_at
            )
            if (
                node.phase is Phase.ALIVE
                and node.idle
                and reclaimable
                and now - node.added_at >= lifetime
                and node.gpu_model not in wanted
                and (node.retry_at is None or now >= node.retry_at)
            ):
                node.move(Phase.DRAINING)
                node.drain_sent_at, node.undrain_sent_at = now, None
                staying -= 1
                out.append(Drain(node.node_id))
        return out

    def wanted(self, now: datetime) -> dict[str, tuple[int, tuple[str, ...]]]:
        """Per allowed model: the GPUs fresh requests ask for, and their jobs. A request is fresh within
        ``demand_ttl_s`` and if newer than the last node of its model that came ALIVE."""
        out: dict[str, tuple[int, tuple[str, ...]]] = {}
        ttl = timedelta(seconds=self.policy.demand_ttl_s)
        for (kind, floor), request in self.demand.items():
            model = self.model_for(kind, floor)
            if model is None or now - request.occurred_at > ttl:
                continue
            joined = self.joined_at.get(model)
            if joined is not None and request.occurred_at <= joined:
                continue
            gpus, jobs = out.get(model, (0, ()))
            out[model] = (gpus + request.gpus, tuple(sorted({*jobs, *request.jobs})))
        return out

    def model_for(self, kind: str, min_tflops: float) -> str | None:
        """The allowed model that serves a request of ``kind`` (a model, or ANY with a TFLOPS floor); None: none."""
        if kind != ANY_MODEL:
            return kind if kind in self.policy.node_gpus else None
        return next((m for m in self.policy.node_gpus if self.policy.tflops.get(m, 0.0) >= min_tflops), None)

    def counts(self) -> dict[tuple[str, str], int]:
        """Managed nodes by (model, phase), for the gauge."""
        out: dict[tuple[str, str], int] = {}
        for node in self.nodes.values():
            key = (node.gpu_model, node.phase.value)
            out[key] = out.get(key, 0) + 1
        return out

    def _cooling(self, now: datetime) -> bool:
        last = self.last_action_at
        return last is not None and now - last < timedelta(seconds=self.policy.cooldown_s)

    def _settled(self, now: datetime) -> list[Managed]:
        """Nodes not being removed, nor waiting for a failed removal's retry."""
        return [
            n
            for n in self.nodes.values()
            if n.phase is not Phase.REMOVING and (n.retry_at is None or now >= n.retry_at)
        ]
