"""The snapshot a cycle decides on, built from the nodes' states and the placed gangs (``Placed``). Pure."""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Protocol

from shardyard.events import JobScheduled, JobSpec, NodeState, ShardPlacement
from shardyard.placement.model import NodeView, Policy, RunningJob, Snapshot
from shardyard.placement.standing import StandingIndex
from shardyard.placement.surplus import split, surplus_key

RENDEZVOUS_PORT_CHOICES = 8


class Placed(Protocol):
    """A placed gang as the snapshot reads it: its spec, its placement, whom it is being preempted for, its last
    durable checkpoint, what its start cost and whether every shard runs (the scheduler's ``Gang``)."""

    @property
    def spec(self) -> JobSpec: ...
    @property
    def scheduled(self) -> JobScheduled: ...
    @property
    def preempted_by(self) -> str | None: ...
    @property
    def checkpointed_at(self) -> datetime | None: ...
    @property
    def restart_s(self) -> float | None: ...
    @property
    def running(self) -> bool: ...


@dataclass
class Usage:
    """What the placed gangs (spares included) hold, per node: GPUs, memory, CPU, rendezvous ports; and the gangs as
    preemptable jobs. Computed from the gangs alone: its cost follows the placements, not the nodes."""

    gpus: dict[str, set[int]] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    ports: dict[str, set[int]] = field(default_factory=dict)
    running: list[RunningJob] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        gangs: Iterable[Placed],
        attained: Mapping[str, float] | None = None,
        expected: Mapping[str, float] | None = None,
        spreads: Mapping[str, tuple[float, ...]] | None = None,
    ) -> "Usage":
        """What ``gangs`` hold; ``attained``: job -> GPU-seconds of its earlier attempts; ``expected``: job -> its
        whole expected run time, declared or learned (a job missing from it: its declaration, if any); ``spreads``:
        job -> its whole run time's spread (``RunningJob.run_quantiles``)."""
        usage = cls()
        earlier = attained or {}
        runs = expected or {}
        spread = spreads or {}
        for gang in gangs:
            for shard in gang.scheduled.placements:
                usage.gpus.setdefault(shard.node_id, set()).update(shard.gpu_indices)
                usage.memory[shard.node_id] = usage.memory.get(shard.node_id, 0) + gang.spec.memory_per_shard
                usage.cpu[shard.node_id] = usage.cpu.get(shard.node_id, 0.0) + gang.spec.cpu_per_shard
            usage.ports.setdefault(gang.scheduled.coordinator_node, set()).add(gang.scheduled.rendezvous_port)
            job_id = gang.spec.job_id
            usage.running.extend(preemptable(gang, earlier.get(job_id, 0.0), runs.get(job_id), spread.get(job_id, ())))
        return usage

    def nodes(self) -> set[str]:
        return {*self.gpus, *self.ports}

    def of_node(self, node_id: str) -> tuple[object, ...]:
        """What the gangs hold on one node: its view is built again only when this (or its state) changes."""
        return (
            frozenset(self.gpus.get(node_id, ())),
            self.memory.get(node_id, 0),
            self.cpu.get(node_id, 0.0),
            frozenset(self.ports.get(node_id, ())),
        )


def preemptable(gang: Placed, ran: float, expected_s: float | None, spread: tuple[float, ...] = ()) -> list[RunningJob]:
    """``gang`` as the jobs preemption may stop: the whole gang; or, for a running elastic gang above its minimum
    that nobody is preempting, its core and each surplus shard alone (``placement.surplus``). ``ran``: GPU-seconds
    of its earlier attempts; ``expected_s``: its whole expected run time (None: its declaration, if any)."""
    spec, scheduled = gang.spec, gang.scheduled
    whole = partial(
        RunningJob,
        priority=spec.priority,
        preemptible=spec.preemptible,
        started_at=scheduled.occurred_at,
        memory_per_shard=spec.memory_per_shard,
        cpu_per_shard=spec.cpu_per_shard,
        preempted_by=gang.preempted_by,
        attained_gpu_s=ran,
        expected_end=expected_end(spec, scheduled.occurred_at, ran, expected_s),
        queue=spec.queue,
        checkpointed_at=gang.checkpointed_at,
        restart_s=gang.restart_s,
        run_quantiles=spread,
    )
    core, surplus = split(spec, scheduled.placements) if gang.running and gang.preempted_by is None else ([], [])
    if not surplus:
        return [whole(job_id=spec.job_id, shards=_by_node(scheduled.placements))]
    return [
        whole(job_id=spec.job_id, shards=_by_node(core)),
        *(
            whole(job_id=surplus_key(spec.job_id, p.shard_index), shards=_by_node([p]), preemptible=True, live=True)
            for p in surplus
        ),
    ]


def _by_node(placements: Iterable[ShardPlacement]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(node id, GPU indices) of ``placements``, a node's GPUs together."""
    shards: dict[str, list[int]] = {}
    for shard in placements:
        shards.setdefault(shard.node_id, []).extend(shard.gpu_indices)
    return tuple((node_id, tuple(gpus)) for node_id, gpus in shards.items())


def node_view(node: NodeState, usage: Usage) -> NodeView | None:
    """A node's view for placement: its free GPUs, memory, CPU and rendezvous ports after every placed gang and
    every reservation the resource pool knows of. None for a node without GPUs.

    A GPU its agent reports unhealthy (a critical Xid, an uncorrected ECC error) is neither free nor counted in the
    node's total: it stays faulted for the agent's life, so no preemption can make room on it."""
    if not node.gpus:
        return None
    taken = usage.gpus.get(node.node_id, set()) | set(node.allocated_gpus)
    healthy = [g for g in node.gpus if g.healthy]
    first, count = node.rendezvous_ports
    used_ports = usage.ports.get(node.node_id, set())
    ports = [p for p in range(first, first + count) if p not in used_ports]
    return NodeView(
        node_id=node.node_id,
        status=node.status,
        address=node.address,
        gpu_model=node.gpus[0].model,
        tflops=min(g.tflops for g in node.gpus),
        free_gpus=tuple(g.index for g in healthy if g.index not in taken),
        free_memory_bytes=node.memory_bytes - usage.memory.get(node.node_id, 0),
        free_cpu_cores=node.cpu_cores - usage.cpu.get(node.node_id, 0.0),
        cpu_load=node.cpu_load,
        rendezvous_ports=tuple(ports[:RENDEZVOUS_PORT_CHOICES]),
        total_gpus=len(healthy),
        total_memory_bytes=node.memory_bytes,
        total_cpu_cores=node.cpu_cores,
        draining=node.draining,
        artifacts=node.artifacts,
        absent_artifacts=frozenset(node.artifacts_absent),
        mounts=node.mounts,
        zone=node.topology.get("zone", ""),
        rack=node.topology.get("rack", ""),
        disk_free_bytes=None if node.output_disk is None else node.output_disk.free_bytes,
    )


def expected_end(
    spec: JobSpec, started_at: datetime, attained_gpu_s: float, expected_s: float | None = None
) -> datetime | None:
    """When a gang started at ``started_at`` is expected to end: its expected run time (``expected_s``, else its
    declared one), less what its earlier attempts ran; None when neither is known."""
    whole = expected_s if expected_s is not None else spec.expected_duration_s
    if whole is None:
        return None
    left_s = max(1.0, whole - attained_gpu_s / max(1, spec.gpu_count))
    return started_at + timedelta(seconds=left_s)


def build_snapshot(nodes: Iterable[NodeState], gangs: Iterable[Placed]) -> Snapshot:
    """The frozen view a cycle decides on: each node's view (:func:`node_view`), by node id, and the gangs as
    preemptable jobs. :class:`SnapshotCache` builds the same snapshot at the cost of what changed."""
    usage = Usage.of(gangs)
    views = [view for node in nodes if (view := node_view(node, usage)) is not None]
    return Snapshot(tuple(sorted(views, key=lambda v: v.node_id)), tuple(usage.running))


class SnapshotCache:
    """The node views of the last snapshot, kept: a cycle builds again only the views of the nodes whose state
    changed (``changed``) or whose gangs changed (the gangs' usage is computed afresh, at the cost of the
    placements). An idle node that says nothing new costs nothing."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.views: dict[str, NodeView] = {}
        self.index = StandingIndex((), policy)
        """The placement index of the views, kept with them."""
        self._held: dict[str, tuple[object, ...]] = {}
        """Per node with gangs on it at the last snapshot: what they held."""
        self._dirty: set[str] = set()

    def changed(self, node_id: str) -> None:
        self._dirty.add(node_id)

    def snapshot(
        self,
        nodes: Mapping[str, NodeState],
        gangs: Iterable[Placed],
        attained: Mapping[str, float] | None = None,
        expected: Mapping[str, float] | None = None,
        stopping: Iterable[RunningJob] = (),
        *,
        spreads: Mapping[str, tuple[float, ...]] | None = None,
    ) -> Snapshot:
        """The snapshot of ``nodes`` and ``gangs``; ``stopping``: shards no gang holds any more that still stop for a
        job (an elastic gang's, given up), listed with the gangs so that the job waits for them."""
        usage = Usage.of(gangs, attained, expected, spreads)
        usage.running.extend(stopping)
        for node_id in self._dirty | self._held.keys() | usage.nodes():
            held = usage.of_node(node_id)
            if node_id not in self._dirty and self._held.get(node_id) == held:
                continue
            state = nodes.get(node_id)
            view = node_view(state, usage) if state is not None else None
            if view is None:
                self.views.pop(node_id, None)
                self.index.remove(node_id)
            else:
                self.views[node_id] = view
                self.index.update(view)
            if held == EMPTY_HOLD:
                self._held.pop(node_id, None)
            else:
                self._held[node_id] = held
        self._dirty.clear()
        # In the order the nodes were first seen (placement orders them itself): a copy at C speed, not a sort.
        return Snapshot(tuple(self.views.values()), tuple(usage.running))


EMPTY_HOLD: tuple[object, ...] = (frozenset(), 0, 0.0, frozenset())
