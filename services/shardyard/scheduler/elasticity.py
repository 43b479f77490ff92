"""Signals for an autoscaler (S18), pure: what capacity the blocked backlog asks for, and which nodes sit idle.

``ElasticityTracker.observe`` is called after each scheduling cycle with its unschedulable verdicts and the current
nodes; it returns ``CapacityRequested`` when the demand of a kind of GPU changes (or every ``repeat_s`` while it
lasts) and ``ReclaimCandidate`` once per idle period for a node nothing uses and nothing waits for.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from shardyard.events import CapacityRequested, Event, JobSpec, NodeState, NodeStatus, PendingReason, ReclaimCandidate
from shardyard.gpus import canonical_model

CAPACITY_REASONS = frozenset(
    {
        PendingReason.NO_NODES,
        PendingReason.NEVER_FITS,  # capacity of a kind or size the cluster lacks: what an autoscaler could add
        PendingReason.GPU_MODEL_MISMATCH,
        PendingReason.INSUFFICIENT_TFLOPS,
        PendingReason.INSUFFICIENT_GPUS,
        PendingReason.LOAD_TOO_HIGH,
        PendingReason.RESERVED_FOR_HIGHER_PRIORITY,
        PendingReason.INSUFFICIENT_MEMORY,
        PendingReason.INSUFFICIENT_CPU,
    }
)
"""Reasons that more nodes would cure (not artifacts, dependencies or preemption in flight)."""


@dataclass
class ElasticityTracker:
    repeat_s: float = 30.0
    reclaim_after_s: float = 300.0
    demand: dict[tuple[str, float], tuple[int, tuple[str, ...], datetime]] = field(default_factory=dict)
    """(model, min TFLOPS) -> (GPUs, jobs, when last published)."""
    idle_since: dict[str, datetime] = field(default_factory=dict)
    reported_idle: set[str] = field(default_factory=set)

    def observe(
        self,
        blocked: Iterable[tuple[JobSpec, PendingReason, datetime]],
        nodes: Mapping[str, NodeState],
        busy_nodes: set[str],
        now: datetime,
    ) -> list[Event]:
        """``blocked``: (spec, reason, ready since) of each unschedulable job; ``busy_nodes``: nodes with shards."""
        out: list[Event] = []
        wanted: dict[tuple[str, float], list[tuple[JobSpec, datetime]]] = {}
        for spec, reason, since in blocked:
            if reason in CAPACITY_REASONS:
                wanted.setdefault((spec.gpu_model or "ANY", spec.min_tflops), []).append((spec, since))
        for kind, jobs in sorted(wanted.items()):
            gpus = sum(spec.shard_count for spec, _ in jobs)
            names = tuple(sorted(spec.job_id for spec, _ in jobs))
            last = self.demand.get(kind)
            unchanged = last is not None and (last[0], last[1]) == (gpus, names)
            if unchanged and last is not None and (now - last[2]).total_seconds() < self.repeat_s:
                continue
            self.demand[kind] = (gpus, names, now)
            out.append(
                CapacityRequested(
                    occurred_at=now,
                    gpu_model=kind[0],
                    min_tflops=kind[1],
                    gpus=gpus,
                    jobs=names,
                    waiting_s=round(max((now - since).total_seconds() for _, since in jobs), 3),
                )
            )
        for kind in [k for k in self.demand if k not in wanted]:
            del self.demand[kind]
        wanted_models = {model for model, _ in wanted}
        for node_id, node in sorted(nodes.items()):
            idle = node.status is NodeStatus.ALIVE and node_id not in busy_nodes and not node.allocated_gpus
            if not idle:
                self.idle_since.pop(node_id, None)
                self.reported_idle.discard(node_id)
                continue
            since = self.idle_since.setdefault(node_id, now)
            model = canonical_model(node.gpus[0].model) if node.gpus else "NONE"
            needed = model in wanted_models or "ANY" in wanted_models
            idle_s = (now - since).total_seconds()
            if idle_s >= self.reclaim_after_s and not needed and node_id not in self.reported_idle:
                self.reported_idle.add(node_id)
                out.append(
                    ReclaimCandidate(
                        occurred_at=now, node_id=node_id, gpu_model=model, gpus=len(node.gpus), idle_s=round(idle_s, 3)
                    )
                )
        return out
