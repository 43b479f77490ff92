"""The scheduler's state (rebuilt from the log) and its decisions, as events to publish. Pure: time comes in."""

from dataclasses import dataclass, field
from datetime import datetime

from shardyard.events import (
    Event,
    JobFailed,
    JobReady,
    JobRunning,
    JobScheduled,
    JobSpec,
    JobSucceeded,
    JobUnschedulable,
    NodeState,
    ShardAssignment,
    ShardCompleted,
    ShardRevocation,
    ShardStarted,
    Workload,
)
from shardyard.scheduler.placement import NodeView, Place, Snapshot, schedule

RENDEZVOUS_PORT_CHOICES = 8


@dataclass
class Gang:
    spec: JobSpec
    scheduled: JobScheduled
    started: set[int] = field(default_factory=set)
    completed: dict[int, ShardCompleted] = field(default_factory=dict)
    running: bool = False


class SchedulerBook:
    def __init__(self, *, term: int = 1, checkpoint_root: str = "/data/checkpoints") -> None:
        self.term = term
        self.checkpoint_root = checkpoint_root.rstrip("/")
        self.nodes: dict[str, NodeState] = {}
        self.pending: dict[str, JobSpec] = {}
        self.gangs: dict[str, Gang] = {}
        self.ports: dict[str, int] = {}
        self.attempts: dict[str, int] = {}
        self.finished: set[str] = set()
        self.reasons: dict[str, tuple[str, str]] = {}

    # --- facts -------------------------------------------------------------------------------------------------
    def apply(self, event: object) -> None:
        match event:
            case NodeState():
                self.nodes[event.node_id] = event
            case JobReady() if event.job_id not in self.finished and event.job_id not in self.gangs:
                self.pending[event.job_id] = event.spec
            case JobScheduled():
                spec = self.pending.pop(event.job_id, None)
                gang = self.gangs.get(event.job_id)
                if spec is None and gang is not None:
                    spec = gang.spec
                if spec is not None and event.job_id not in self.finished:
                    self.gangs[event.job_id] = Gang(spec, event)
                    self.ports[event.job_id] = event.rendezvous_port
                self.attempts[event.job_id] = max(self.attempts.get(event.job_id, 0), event.attempt)
                self.term = max(self.term, event.term)
            case JobRunning() if event.job_id in self.gangs:
                self.gangs[event.job_id].running = True
            case JobSucceeded() | JobFailed():
                self.pending.pop(event.job_id, None)
                self.gangs.pop(event.job_id, None)
                self.ports.pop(event.job_id, None)
                self.reasons.pop(event.job_id, None)
                self.finished.add(event.job_id)
            case ShardStarted() if self._current(event.job_id, event.attempt):
                self.gangs[event.job_id].started.add(event.shard_index)
            case ShardCompleted() if self._current(event.job_id, event.attempt):
                self.gangs[event.job_id].completed[event.shard_index] = event
            case _:
                pass

    def _current(self, job_id: str, attempt: int) -> bool:
        gang = self.gangs.get(job_id)
        return gang is not None and gang.scheduled.attempt == attempt

    # --- decisions ---------------------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        used_gpus: dict[str, set[int]] = {}
        used_memory: dict[str, int] = {}
        used_cpu: dict[str, float] = {}
        used_ports: dict[str, set[int]] = {}
        for job_id, gang in self.gangs.items():
            for shard in gang.scheduled.placements:
                used_gpus.setdefault(shard.node_id, set()).update(shard.gpu_indices)
                used_memory[shard.node_id] = used_memory.get(shard.node_id, 0) + gang.spec.memory_per_shard
                used_cpu[shard.node_id] = used_cpu.get(shard.node_id, 0.0) + gang.spec.cpu_per_shard
            used_ports.setdefault(gang.scheduled.coordinator_node, set()).add(self.ports.get(job_id, 0))
        views = []
        for node in self.nodes.values():
            if not node.gpus:
                continue
            taken = used_gpus.get(node.node_id, set()) | set(node.allocated_gpus)
            first, count = node.rendezvous_ports
            ports = [p for p in range(first, first + count) if p not in used_ports.get(node.node_id, set())]
            views.append(
                NodeView(
                    node_id=node.node_id,
                    status=node.status,
                    address=node.address,
                    gpu_model=node.gpus[0].model,
                    tflops=min(g.tflops for g in node.gpus),
                    free_gpus=tuple(g.index for g in node.gpus if g.index not in taken),
                    free_memory_bytes=node.memory_bytes - used_memory.get(node.node_id, 0),
                    free_cpu_cores=node.cpu_cores - used_cpu.get(node.node_id, 0.0),
                    cpu_load=node.cpu_load,
                    rendezvous_ports=tuple(ports[:RENDEZVOUS_PORT_CHOICES]),
                )
            )
        return Snapshot(tuple(sorted(views, key=lambda v: v.node_id)))

    def cycle(self, now: datetime) -> list[Event]:
        """One scheduling cycle over every pending job; returns the events that carry out its decisions."""
        if not self.pending:
            return []
        snapshot = self.snapshot()
        by_id = {view.node_id: view for view in snapshot.nodes}
        out: list[Event] = []
        for decision in schedule(snapshot, list(self.pending.values()), now):
            if isinstance(decision, Place):
                out.extend(self._admit(decision, by_id, now))
                # Later decisions of this cycle already accounted for this gang; the next snapshot must too.
                snapshot = self.snapshot()
                by_id = {view.node_id: view for view in snapshot.nodes}
            elif self.reasons.get(decision.job_id) != (decision.reason, decision.message):
                self.reasons[decision.job_id] = (decision.reason, decision.message)
                out.append(
                    JobUnschedulable(
                        occurred_at=now,
                        job_id=decision.job_id,
                        reason=decision.reason,
                        message=decision.message,
                        node_counts=decision.node_counts,
                    )
                )
        return out

    def _admit(self, place: Place, nodes: dict[str, NodeView], now: datetime) -> list[Event]:
        spec = self.pending[place.job_id]
        attempt = self.attempts.get(place.job_id, 0) + 1
        coordinator = nodes[place.coordinator_node]
        port = coordinator.rendezvous_ports[0]
        scheduled = JobScheduled(
            occurred_at=now,
            job_id=place.job_id,
            attempt=attempt,
            term=self.term,
            coordinator_node=place.coordinator_node,
            rendezvous_port=port,
            placements=place.placements,
        )
        workload = Workload(
            model_path=spec.model_path,
            dataset_path=spec.dataset_path,
            output_path=f"{self.checkpoint_root}/{spec.job_id}",
            sync_interval=spec.sync_interval,
            max_steps=spec.max_steps,
            batch_size=spec.batch_size,
            seq_len=spec.seq_len,
            lr=spec.lr,
            seed=spec.seed,
        )
        assignments = [
            ShardAssignment(
                occurred_at=now,
                job_id=spec.job_id,
                shard_index=shard.shard_index,
                world_size=spec.shard_count,
                node_id=shard.node_id,
                gpu_indices=shard.gpu_indices,
                attempt=attempt,
                term=self.term,
                master_addr=coordinator.address,
                master_port=port,
                workload=workload,
            )
            for shard in place.placements
        ]
        self.apply(scheduled)
        self.reasons.pop(place.job_id, None)
        return [scheduled, *assignments]

    def on_shard_event(self, now: datetime) -> list[Event]:
        """Gang-level consequences of shard facts: every shard started -> RUNNING; every shard done -> SUCCEEDED."""
        out: list[Event] = []
        for job_id, gang in list(self.gangs.items()):
            attempt = gang.scheduled.attempt
            if not gang.running and len(gang.started) == gang.spec.shard_count:
                gang.running = True
                out.append(JobRunning(occurred_at=now, job_id=job_id, attempt=attempt))
            if len(gang.completed) == gang.spec.shard_count:
                lead = gang.completed.get(0) or next(iter(gang.completed.values()))
                event = JobSucceeded(
                    occurred_at=now,
                    job_id=job_id,
                    attempt=attempt,
                    final_loss=lead.final_loss,
                    checkpoint_dir=lead.checkpoint_dir,
                )
                self.apply(event)
                out.append(event)
        return out

    def revocations(self, failed: JobFailed, now: datetime) -> list[Event]:
        """Stop the shards of a failed job that are still running, so its GPUs are freed at once."""
        gang = self.gangs.get(failed.job_id)
        if gang is None:
            return []
        return [
            ShardRevocation(
                occurred_at=now,
                job_id=failed.job_id,
                shard_index=shard.shard_index,
                node_id=shard.node_id,
                attempt=gang.scheduled.attempt,
                term=self.term,
                reason=f"job failed: {failed.cause}",
            )
            for shard in gang.scheduled.placements
            if shard.shard_index not in gang.completed
        ]
