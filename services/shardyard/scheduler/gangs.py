"""Gangs (placed jobs) as the scheduler book tracks them, and the snapshot a cycle decides on. Pure."""

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from shardyard.events import JobScheduled, JobSpec, NodeState, ShardCompleted, ShardPreempted
from shardyard.scheduler.model import NodeView, RunningJob, Snapshot

RENDEZVOUS_PORT_CHOICES = 8


@dataclass
class Gang:
    spec: JobSpec
    scheduled: JobScheduled
    started: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    """Shards reported failed (by their agent, or by the scheduler at their start deadline)."""
    completed: dict[int, ShardCompleted] = field(default_factory=dict)
    preempted: dict[int, ShardPreempted] = field(default_factory=dict)
    running: bool = False
    preempted_by: str | None = None
    preempt_deadline: datetime | None = None


def build_snapshot(nodes: Iterable[NodeState], gangs: Iterable[Gang]) -> Snapshot:
    """The frozen view a cycle decides on: each node's free GPUs, memory, CPU and rendezvous ports after every
    placed gang (spares included) and every reservation the resource pool knows of; the gangs as preemptable jobs.

    A GPU its agent reports unhealthy (a critical Xid, an uncorrected ECC error) is neither free nor counted in the
    node's total: it stays faulted for the agent's life, so no preemption can make room on it."""
    used_gpus: dict[str, set[int]] = {}
    used_memory: dict[str, int] = {}
    used_cpu: dict[str, float] = {}
    used_ports: dict[str, set[int]] = {}
    running: list[RunningJob] = []
    for gang in gangs:
        shards: dict[str, list[int]] = {}
        for shard in gang.scheduled.placements:
            used_gpus.setdefault(shard.node_id, set()).update(shard.gpu_indices)
            used_memory[shard.node_id] = used_memory.get(shard.node_id, 0) + gang.spec.memory_per_shard
            used_cpu[shard.node_id] = used_cpu.get(shard.node_id, 0.0) + gang.spec.cpu_per_shard
            shards.setdefault(shard.node_id, []).extend(shard.gpu_indices)
        used_ports.setdefault(gang.scheduled.coordinator_node, set()).add(gang.scheduled.rendezvous_port)
        running.append(
            RunningJob(
                job_id=gang.spec.job_id,
                priority=gang.spec.priority,
                preemptible=gang.spec.preemptible,
                started_at=gang.scheduled.occurred_at,
                shards=tuple((node_id, tuple(gpus)) for node_id, gpus in shards.items()),
                memory_per_shard=gang.spec.memory_per_shard,
                cpu_per_shard=gang.spec.cpu_per_shard,
                preempted_by=gang.preempted_by,
            )
        )
    views = []
    for node in nodes:
        if not node.gpus:
            continue
        taken = used_gpus.get(node.node_id, set()) | set(node.allocated_gpus)
        healthy = [g for g in node.gpus if g.healthy]
        first, count = node.rendezvous_ports
        ports = [p for p in range(first, first + count) if p not in used_ports.get(node.node_id, set())]
        views.append(
            NodeView(
                node_id=node.node_id,
                status=node.status,
                address=node.address,
                gpu_model=node.gpus[0].model,
                tflops=min(g.tflops for g in node.gpus),
                free_gpus=tuple(g.index for g in healthy if g.index not in taken),
                free_memory_bytes=node.memory_bytes - used_memory.get(node.node_id, 0),
                free_cpu_cores=node.cpu_cores - used_cpu.get(node.node_id, 0.0),
                cpu_load=node.cpu_load,
                rendezvous_ports=tuple(ports[:RENDEZVOUS_PORT_CHOICES]),
                total_gpus=len(healthy),
                total_memory_bytes=node.memory_bytes,
                total_cpu_cores=node.cpu_cores,
                draining=node.draining,
                artifacts=node.artifacts,
                zone=node.topology.get("zone", ""),
                rack=node.topology.get("rack", ""),
            )
        )
    return Snapshot(tuple(sorted(views, key=lambda v: v.node_id)), tuple(running))
