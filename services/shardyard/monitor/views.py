"""The monitor's picture of the cluster, folded from every topic. Pure: events in, JSON-ready views out."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shardyard.events import (
    CapacityRequested,
    Heartbeat,
    JobAccepted,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPreempted,
    JobPreempting,
    JobReady,
    JobRecovering,
    JobRejected,
    JobRunning,
    JobScheduled,
    JobSucceeded,
    JobUnschedulable,
    JobWaiting,
    LeaderElected,
    NodeDrain,
    NodeLost,
    NodeState,
    ReclaimCandidate,
    RedundancyChanged,
    RejectReason,
    ServiceReady,
    ShardCheckpointed,
    ShardCompleted,
    ShardFailed,
    ShardPreempted,
    ShardProgress,
    ShardStarted,
)
from shardyard.lifecycle import TERMINAL, JobState, LifecycleFact, can_move, target_state

MAX_TIMELINE = 500
MAX_SERIES = 2000


@dataclass
class JobView:
    job_id: str
    state: JobState | None = None
    reason: str | None = None
    message: str = ""
    node_counts: dict[str, int] = field(default_factory=dict)
    """Nodes excluded, by the scheduler's filter, behind the current pending reason."""
    waiting_for: list[str] = field(default_factory=list)
    """Parent jobs the queue holds this one for."""
    spec: dict[str, Any] | None = None
    attempt: int = 0
    submitted_at: datetime | None = None
    first_step_at: datetime | None = None
    ended_at: datetime | None = None
    final_loss: float | None = None
    checkpoint_dir: str | None = None
    placements: list[dict[str, Any]] = field(default_factory=list)
    degraded: bool = False
    resume_from: str | None = None
    preempting: tuple[int, str] | None = None
    recoveries: int = 0
    last_checkpoint: dict[str, Any] | None = None
    """(attempt, by job) of the preemption under way, so a redelivered JobPreempting is noted once."""
    shards: dict[int, dict[str, Any]] = field(default_factory=dict)
    loss: list[tuple[int, float]] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)

    def pending(self, reason: str | None, message: str, *, node_counts: dict[str, int], waiting_for: list[str]) -> None:
        """Set the current reason (None: none) with its details; every other detail of the last one goes."""
        self.reason, self.message = reason, message
        self.node_counts, self.waiting_for = node_counts, waiting_for

    def note(self, at: datetime, what: str, detail: str = "") -> None:
        if len(self.timeline) < MAX_TIMELINE:
            self.timeline.append({"at": at.isoformat(), "event": what, "detail": detail})

    def summary(self) -> dict[str, Any]:
        steps = [s.get("step", 0) for s in self.shards.values()]
        return {
            "job_id": self.job_id,
            "state": self.state,
            "reason": self.reason,
            "message": self.message,
            "priority": self.spec.get("priority") if self.spec else None,
            "gpus": f"{self.spec['gpu_count']} x {self.spec['gpu_model'] or 'any'}" if self.spec else None,
            "attempt": self.attempt,
            "step": min(steps) if steps else 0,
            "max_steps": self.spec.get("max_steps") if self.spec else None,
            "loss": self.loss[-1][1] if self.loss else None,
            "submitted_at": self.submitted_at.isoformat() if self.submitted_at else None,
        }

    def detail(self) -> dict[str, Any]:
        first = self.loss[0][1] if self.loss else None
        return {
            **self.summary(),
            "recoveries": self.recoveries,
            "last_checkpoint": self.last_checkpoint,
            "spec": self.spec,
            "errors": self.errors,
            "node_counts": self.node_counts,
            "waiting_for": self.waiting_for,
            "placements": self.placements,
            "degraded": self.degraded,
            "resume_from": self.resume_from,
            "shards": {str(k): v for k, v in sorted(self.shards.items())},
            "first_loss": first,
            "final_loss": self.final_loss,
            "checkpoint_dir": self.checkpoint_dir,
            "first_step_at": self.first_step_at.isoformat() if self.first_step_at else None,
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "loss_curve": self.loss,
            "timeline": self.timeline,
        }


def _waiting(view: JobView, event: JobWaiting) -> None:
    waiting_for = list(event.waiting_for)
    if (view.reason, view.message, view.waiting_for) == (event.reason, event.message, waiting_for):
        return  # the same reason again
    view.pending(event.reason, event.message, node_counts={}, waiting_for=waiting_for)
    view.note(event.occurred_at, "waiting", event.message)


def _scheduled(view: JobView, event: JobScheduled) -> None:
    view.attempt, view.degraded, view.resume_from = event.attempt, event.degraded, event.resume_from
    view.preempting = None
    view.pending(None, "", node_counts={}, waiting_for=[])
    view.placements = [p.model_dump() for p in event.placements]
    where = ", ".join(
        f"shard {p.shard_index} -> {p.node_id} GPU {p.gpu_indices}"
        + (f" degraded (match {p.match_score:.2f})" if p.degraded else "")
        for p in event.placements
    )
    detail = f"attempt {event.attempt}{' (degraded)' if event.degraded else ''}: {where}; "
    detail += f"coordinator {event.coordinator_node}"
    if event.resume_from:
        detail += f"; resuming from {event.resume_from}"
    view.note(event.occurred_at, "scheduled", detail)


@dataclass
class ClusterView:
    jobs: dict[str, JobView] = field(default_factory=dict)
    nodes: dict[str, NodeState] = field(default_factory=dict)
    heartbeats: dict[str, Heartbeat] = field(default_factory=dict)
    services: dict[str, ServiceReady] = field(default_factory=dict)
    leaders: dict[str, LeaderElected] = field(default_factory=dict)
    """Each replicated service's current leader: the election with the highest term."""
    dead_letters: int = 0
    preemptions: int = 0
    """Completed preemptions (JobPreempted), each counted once."""
    cancellations: int = 0
    """Jobs cancelled (JobCancelled), each counted once."""
    recoveries: int = 0
    """Recovery plans (JobRecovering), each counted once."""
    spare_ratio: float = 0.0
    failure_rate: float = 0.0

    def job(self, job_id: str) -> JobView:
        return self.jobs.setdefault(job_id, JobView(job_id))

    def apply(self, event: object) -> None:
        match event:
            case NodeState():
                self.nodes[event.node_id] = event
            case Heartbeat():
                self.heartbeats[event.node_id] = event
            case NodeDrain():
                pass  # the resource pool answers with the node's state, which carries the mark
            case ServiceReady():
                self.services[f"{event.service}/{event.instance}"] = event
            case LeaderElected():
                current = self.leaders.get(event.service)
                if current is None or event.term > current.term:
                    self.leaders[event.service] = event
            case NodeLost():
                pass  # the node's state event says the same; fault handling shows on its jobs
            case RedundancyChanged():
                self.spare_ratio, self.failure_rate = event.ratio, event.failure_rate
            case ShardCheckpointed():
                view = self.job(event.job_id)
                view.last_checkpoint = {"step": event.step, "dir": event.checkpoint_dir, "attempt": event.attempt}
            case ShardPreempted() | CapacityRequested() | ReclaimCandidate():
                pass  # shown through the job's preemption events; elasticity signals are for autoscalers
            case ShardStarted() | ShardProgress() | ShardCompleted() | ShardFailed():
                self._shard(event)
            case _:
                self._lifecycle(event)  # type: ignore[arg-type]

    def _lifecycle(self, event: LifecycleFact) -> None:
        view = self.job(event.job_id)
        target = target_state(event)
        if isinstance(event, JobRejected) and (
            event.reason is RejectReason.DUPLICATE_JOB or not can_move(view.state, JobState.REJECTED)
        ):
            view.note(event.occurred_at, "resubmission refused", f"{event.reason}: {event.message}")
            return
        if isinstance(event, JobWaiting) and view.state is JobState.WAITING:
            _waiting(view, event)  # a held job's new reason: no move
            return
        if target is not None and not can_move(view.state, target):
            return  # late or duplicated: the transition table keeps the job where it is
        if target is not None:
            view.state = target
        match event:
            case JobAccepted():
                view.spec = event.spec.model_dump(mode="json")
                view.submitted_at = event.spec.submitted_at
                view.pending(None, "", node_counts={}, waiting_for=[])
                view.errors = []
                view.note(event.occurred_at, "accepted", f"priority {event.spec.priority}")
            case JobRejected():
                view.pending(event.reason, event.message, node_counts={}, waiting_for=[])
                view.errors = [e.model_dump() for e in event.errors]
                view.ended_at = event.occurred_at
                view.note(event.occurred_at, "rejected", f"{event.reason}: {event.message}")
            case JobWaiting():
                _waiting(view, event)
            case JobReady():
                view.pending(None, "", node_counts={}, waiting_for=[])
                view.note(event.occurred_at, "ready", "dependencies met; waiting for placement")
            case JobUnschedulable():
                view.pending(event.reason, event.message, node_counts=dict(event.node_counts), waiting_for=[])
                view.note(event.occurred_at, "unschedulable", event.message)
            case JobScheduled():
                _scheduled(view, event)
            case JobRunning():
                view.note(event.occurred_at, "running", "every shard started")
            case JobPreempting():
                if view.preempting != (event.attempt, event.by_job):
                    view.preempting = (event.attempt, event.by_job)
                    view.note(
                        event.occurred_at,
                        "preempting",
                        f"attempt {event.attempt} yields to {event.by_job}: "
                        f"checkpoint and stop within {event.deadline_s:g}s",
                    )
            case JobPreempted():
                self.preemptions += 1
                view.preempting = None
                view.pending(None, f"preempted by {event.by_job}; requeued", node_counts={}, waiting_for=[])
                kept = (
                    f"checkpoint {event.checkpoint_dir} at step {event.checkpoint_step}"
                    if event.checkpoint_dir
                    else "no checkpoint: the next attempt starts over"
                )
                view.note(event.occurred_at, "preempted", f"attempt {event.attempt} stopped for {event.by_job}; {kept}")
            case JobRecovering():
                self.recoveries += 1
                view.recoveries += 1
                view.preempting = None
                excluded = f"; avoiding {', '.join(event.exclude_nodes)}" if event.exclude_nodes else ""
                view.pending(None, f"recovering from {event.cause}{excluded}", node_counts={}, waiting_for=[])
                view.note(
                    event.occurred_at,
                    "recovering",
                    f"attempt {event.attempt} failed ({event.cause}: {event.message}); retry {event.retries_used}, "
                    f"{event.retries_left} left{excluded}",
                )
            case JobCancelRequested():
                if view.state is not None and view.state not in TERMINAL:
                    view.note(event.occurred_at, "cancel requested", f"by {event.requested_by}")
            case JobCancelled():
                self.cancellations += 1
                view.pending("CANCELLED", event.message, node_counts={}, waiting_for=[])
                view.ended_at = event.occurred_at
                view.note(event.occurred_at, "cancelled", event.message)
            case JobSucceeded():
                view.final_loss, view.checkpoint_dir = event.final_loss, event.checkpoint_dir
                view.ended_at = event.occurred_at
                view.note(
                    event.occurred_at, "succeeded", f"final loss {event.final_loss}; checkpoint {event.checkpoint_dir}"
                )
            case JobFailed():
                view.pending(event.cause, event.message, node_counts={}, waiting_for=[])
                view.ended_at = event.occurred_at
                view.note(event.occurred_at, "failed", f"{event.cause}: {event.message}")

    def _shard(self, event: ShardStarted | ShardProgress | ShardCompleted | ShardFailed) -> None:
        view = self.job(event.job_id)
        if event.attempt < view.attempt:
            return
        shard = view.shards.setdefault(event.shard_index, {"node_id": event.node_id, "state": "STARTING", "step": 0})
        shard["node_id"] = event.node_id
        shard["attempt"] = event.attempt
        match event:
            case ShardStarted():
                shard["state"] = "RUNNING"
                shard["pid"] = event.pid
                view.note(event.occurred_at, "shard started", f"shard {event.shard_index} on {event.node_id}")
            case ShardProgress():
                previous_syncs = shard.get("syncs", 0)
                shard.update(
                    step=event.step,
                    loss=event.loss,
                    samples_per_s=event.samples_per_s,
                    allreduce_ms=event.allreduce_ms,
                    allreduce_bytes=event.allreduce_bytes,
                    syncs=event.syncs,
                    cpu_percent=event.cpu_percent,
                    updated_at=event.occurred_at.isoformat(),
                )
                if view.first_step_at is None:
                    view.first_step_at = event.occurred_at
                if event.shard_index == 0 and len(view.loss) < MAX_SERIES:
                    view.loss.append((event.step, event.loss))
                if event.shard_index == 0 and event.syncs > previous_syncs:
                    view.note(
                        event.occurred_at,
                        "parameter sync",
                        f"sync {event.syncs} at step {event.step}: {event.allreduce_ms:.1f} ms, "
                        f"{event.allreduce_bytes} bytes",
                    )
            case ShardCompleted():
                shard["state"] = "COMPLETED"
                shard["final_loss"] = event.final_loss
                view.note(event.occurred_at, "shard completed", f"shard {event.shard_index}: loss {event.final_loss}")
            case ShardFailed():
                shard["state"] = "FAILED"
                shard["cause"] = event.cause
                view.note(
                    event.occurred_at, "shard failed", f"shard {event.shard_index}: {event.cause}: {event.message}"
                )

    # --- JSON views ---------------------------------------------------------------------------------------------
    def jobs_json(self) -> list[dict[str, Any]]:
        return [view.summary() for view in self.jobs.values() if view.state is not None]

    def nodes_json(self) -> list[dict[str, Any]]:
        out = []
        for node in sorted(self.nodes.values(), key=lambda n: n.node_id):
            out.append(
                {
                    "node_id": node.node_id,
                    "status": node.status,
                    "draining": node.draining,
                    "topology": dict(node.topology),
                    "artifact_count": len(node.artifacts),
                    "gpus": [g.model_dump() for g in node.gpus],  # with tflops and tflops_source
                    "allocated_gpus": list(node.allocated_gpus),
                    "cpu_load": node.cpu_load,
                    "cpu_cores": node.cpu_cores,
                    "memory_bytes": node.memory_bytes,
                    "last_heartbeat_at": node.last_heartbeat_at.isoformat(),
                    "running": [r.model_dump() for r in node.running],
                }
            )
        return out

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {state.value: 0 for state in JobState}
        for view in self.jobs.values():
            if view.state is not None:
                out[view.state.value] += 1
        return out

    def active_jobs(self) -> int:
        return sum(1 for v in self.jobs.values() if v.state is not None and v.state not in TERMINAL)
