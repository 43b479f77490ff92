"""What a policy reads in a cycle (``State``): the nodes' free GPUs, the pending jobs and the running gangs.

A policy must not change it: it returns actions (``sim.engine``), which the engine applies.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from shardyard.errors import ShardyardError
from shardyard.sim.cluster import NodeSpec
from shardyard.sim.gang import Gang
from shardyard.sim.lost_work import WorkModel
from shardyard.sim.trace import TraceJob

GroupKey = tuple[str, float]
"""(GPU model, TFLOPS): nodes that are interchangeable for every filter."""


class SimulationError(ShardyardError):
    """A policy asked for something the simulated cluster cannot do (a bug in the policy, not in the trace)."""


@dataclass
class Waiting:
    """A pending job."""

    job: TraceJob
    order: int
    """Position in submission order (submit time, then trace order): FIFO order."""
    ready_us: int
    """Submission, or the end of the checkpoint after a preemption."""
    remaining_s: float
    """Work left, in seconds on full-match GPUs at the job's preferred size (``gpus``)."""


class State:
    """What a policy reads in a cycle. Policies must not change it: they return actions."""

    def __init__(self, nodes: Sequence[NodeSpec], work: WorkModel | None = None) -> None:
        self.nodes = tuple(nodes)
        self.work = work or WorkModel()
        """How gangs checkpoint, take notice, restart and resize: a policy reads the restart cost of a preemption
        here."""
        self.by_id = {node.node_id: node for node in self.nodes}
        self.free: dict[str, tuple[int, ...]] = {node.node_id: tuple(range(node.gpus)) for node in self.nodes}
        """Node id -> free GPU indices, ascending."""
        self.group_free: dict[GroupKey, int] = {}
        for node in self.nodes:
            key = (node.gpu_model, node.tflops)
            self.group_free[key] = self.group_free.get(key, 0) + node.gpus
        self.pending: dict[str, Waiting] = {}
        self.running: dict[str, Gang] = {}
        self.elastic: dict[str, None] = {}
        """The running gangs of elastic jobs, in the order they started (oldest first)."""
        self.changed: dict[str, None] = dict.fromkeys(node.node_id for node in self.nodes)
        """Nodes whose free GPUs changed since a policy last emptied this (all, at first), in the order they
        changed (a set's order would change from run to run): a policy that keeps its own index up to date reads
        it instead of every node."""
        self.gangs_changed: dict[str, None] = {}
        """Jobs whose gang started, stopped, resized or was told to stop since a policy last emptied this: a policy
        that keeps its own view of the gangs reads it instead of every gang."""
        self._eligible: dict[tuple[str | None, float], tuple[tuple[GroupKey, ...], tuple[NodeSpec, ...], int]] = {}

    def eligible(self, job: TraceJob) -> tuple[tuple[GroupKey, ...], tuple[NodeSpec, ...], int]:
        """The groups and nodes (declaration order) of a full match for ``job`` and their GPUs in all."""
        key = (job.gpu_model, job.min_tflops)
        known = self._eligible.get(key)
        if known is None:
            nodes = tuple(
                node
                for node in self.nodes
                if (job.gpu_model is None or node.gpu_model == job.gpu_model) and node.tflops >= job.min_tflops
            )
            groups = tuple(dict.fromkeys((node.gpu_model, node.tflops) for node in nodes))
            known = self._eligible[key] = (groups, nodes, sum(node.gpus for node in nodes))
        return known

    def take(self, node_id: str, gpus: tuple[int, ...]) -> None:
        free = self.free[node_id]
        if not set(gpus) <= set(free) or len(set(gpus)) != len(gpus):
            raise SimulationError(f"GPUs {gpus} of {node_id} are not free (free: {free})")
        self.free[node_id] = tuple(g for g in free if g not in gpus)
        self.changed[node_id] = None
        node = self.by_id[node_id]
        self.group_free[(node.gpu_model, node.tflops)] -= len(gpus)

    def give_back(self, node_id: str, gpus: tuple[int, ...]) -> None:
        self.free[node_id] = tuple(sorted((*self.free[node_id], *gpus)))
        self.changed[node_id] = None
        node = self.by_id[node_id]
        self.group_free[(node.gpu_model, node.tflops)] += len(gpus)
