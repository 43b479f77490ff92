"""The monitor's picture of the cluster, folded from every topic. Pure: events in, JSON-ready views out."""

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shardyard.clock import Clock, SystemClock
from shardyard.events import (
    AlertFiring,
    AlertResolved,
    CapacityRequested,
    FailureCause,
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
    NodeStatus,
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
from shardyard.monitor.alerts import AlertLog, SyncPace

MAX_TIMELINE = 500
MAX_SERIES = 2000
SERIES_POINTS = 512
"""Points of a job's progress series: about a chart's width in pixels, small enough to poll every second."""
ENDED_SHARD = frozenset({"COMPLETED", "FAILED"})
"""Shard states whose last throughput no longer counts towards the gang's."""

SeriesPoint = tuple[int, float, float, float]
"""(step, seconds since the job's first step, rank 0's loss, samples/s of the whole gang)."""


@dataclass
class ProgressSeries:
    """A job's loss and throughput over steps and time, for the dashboard's curves.

    Bounded without losing the run's shape: when full, every other point goes and from then on only every
    ``stride``-th report is kept, so a long run shows its whole curve at a coarser grain instead of stopping at its
    first ``limit`` reports. The newest report is always shown, so the curve ends where the job is. A report whose
    step goes back (a gang re-formed from an earlier checkpoint) drops the points past it: that work was lost.
    """

    limit: int = SERIES_POINTS
    points: list[SeriesPoint] = field(default_factory=list)
    latest: SeriesPoint | None = None
    stride: int = 1
    reports: int = 0

    def add(self, point: SeriesPoint) -> None:
        if self.latest is not None and point[0] < self.latest[0]:
            self.points = [p for p in self.points if p[0] < point[0]]
        self.latest = point
        self.reports += 1
        if (self.reports - 1) % self.stride:
            return
        self.points.append(point)
        if len(self.points) >= self.limit:
            self.points = self.points[::2]
            self.stride *= 2

    def columns(self) -> dict[str, Any]:
        """Column arrays (``step``, ``t_s``, ``loss``, ``samples_per_s``): the shape a chart walks, and compact."""
        points = list(self.points)
        if self.latest is not None and (not points or points[-1] != self.latest):
            points.append(self.latest)
        step, t_s, loss, rate = (list(column) for column in zip(*points, strict=True)) if points else ([], [], [], [])
        return {"stride": self.stride, "step": step, "t_s": t_s, "loss": _finite(loss), "samples_per_s": _finite(rate)}


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
    series: ProgressSeries = field(default_factory=ProgressSeries)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    # What the alert rules (monitor/alerts.py) read beside the above:
    reason_since: datetime | None = None
    """When the scheduler first gave the current pending reason (set by job.unschedulable only)."""
    running_at: datetime | None = None
    """When the current attempt's gang was last seen RUNNING."""
    sync_timeout: ShardFailed | None = None
    """The newest shard failure of this job by SYNC_TIMEOUT."""
    sync_pace: SyncPace = field(default_factory=SyncPace)

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

    def series_json(self) -> dict[str, Any]:
        """The dashboard's curves, apart from ``detail()`` so that polling them does not resend the timeline."""
        max_steps = self.spec.get("max_steps") if self.spec else None
        return {"job_id": self.job_id, "state": self.state, "max_steps": max_steps, **self.series.columns()}


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


def _finite(values: list[float]) -> list[float | None]:
    """A diverged run's NaN or inf as null: JSON has no such numbers, and one would break the whole response."""
    return [v if math.isfinite(v) else None for v in values]


def _series_point(view: JobView, event: ShardProgress) -> SeriesPoint:
    """Rank 0's step and loss (every rank trains the same averaged model), with the gang's summed throughput."""
    gang = [s for s in view.shards.values() if s.get("attempt") == event.attempt and s["state"] not in ENDED_SHARD]
    rate = sum(s.get("samples_per_s", 0.0) for s in gang)
    since = (event.occurred_at - view.first_step_at).total_seconds() if view.first_step_at else 0.0
    return (event.step, round(since, 3), event.loss, round(rate, 3))


@dataclass
class SyncTotals:
    """One shard's parameter syncs summed from its progress reports: counters, so ``rate()`` gives time and bytes
    per second. Agents report at every sync, so the rare sync between two reports is counted at the later one's
    figures."""

    attempt: int = 0
    syncs: int = 0
    """The last report's count, of this attempt (each attempt's runner counts from 0)."""
    count: int = 0
    seconds: float = 0.0
    bytes: int = 0


@dataclass
class Telemetry:
    """What the monitor's metrics need beyond the cluster picture: heartbeat lag, shard failures by cause, recovery
    times and AllReduce totals. The clock reads arrival times only; every other figure uses the events' own times."""

    clock: Clock = field(default_factory=SystemClock, repr=False)
    heartbeat_lag_s: dict[str, float] = field(default_factory=dict)
    """Per node: the monitor's receipt of its last heartbeat minus the heartbeat's ``occurred_at``."""
    shard_failures: dict[str, int] = field(default_factory=dict)
    """Failed shard attempts by cause, each (job, shard, attempt) once."""
    recovery_s: list[float] = field(default_factory=list)
    """Per recovery: from the first plan (``job.recovering``) to the re-formed gang's first training progress."""
    syncs: dict[tuple[str, int], SyncTotals] = field(default_factory=dict)
    _failed: set[tuple[str, int, int]] = field(default_factory=set)
    _recovering: dict[str, tuple[int, datetime]] = field(default_factory=dict)
    """Job -> (attempt that failed last, when its recovery began)."""

    def fold(self, event: object) -> None:
        match event:
            case Heartbeat():
                self.heartbeat_lag_s[event.node_id] = (self.clock.now() - event.occurred_at).total_seconds()
            case ShardFailed() if (event.job_id, event.shard_index, event.attempt) not in self._failed:
                self._failed.add((event.job_id, event.shard_index, event.attempt))
                self.shard_failures[event.cause] = self.shard_failures.get(event.cause, 0) + 1
            case JobRecovering():
                began = self._recovering.get(event.job_id, (0, event.occurred_at))[1]  # a retry extends the outage
                self._recovering[event.job_id] = (event.attempt, began)
            case ShardProgress():
                self._synced(event)
                failed = self._recovering.get(event.job_id)
                if failed is not None and event.attempt > failed[0]:
                    del self._recovering[event.job_id]
                    self.recovery_s.append((event.occurred_at - failed[1]).total_seconds())
            case JobSucceeded() | JobFailed() | JobCancelled():
                self._recovering.pop(event.job_id, None)
                for key in [k for k in self.syncs if k[0] == event.job_id]:
                    del self.syncs[key]

    def _synced(self, event: ShardProgress) -> None:
        totals = self.syncs.setdefault((event.job_id, event.shard_index), SyncTotals())
        if event.attempt < totals.attempt:
            return  # a late report of an attempt already replaced
        if event.attempt > totals.attempt:
            totals.attempt, totals.syncs = event.attempt, 0
        new = event.syncs - totals.syncs
        if new > 0:
            totals.count += new
            totals.seconds += new * event.allreduce_ms / 1000.0
            totals.bytes += new * event.allreduce_bytes
            totals.syncs = event.syncs


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
    telemetry: Telemetry = field(default_factory=Telemetry)
    alerts: AlertLog = field(default_factory=AlertLog)
    """Alerts as the alerts topic says (every monitor replica's evaluator publishes there)."""
    consumer_lag: dict[str, int] = field(default_factory=dict)
    """Messages between this replica's position and each watched topic's end, as last measured (empty: not yet)."""

    def job(self, job_id: str) -> JobView:
        return self.jobs.setdefault(job_id, JobView(job_id))

    def apply(self, event: object) -> None:
        self.telemetry.fold(event)
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
            case AlertFiring() | AlertResolved():
                self.alerts.apply(event)
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
                if view.reason != event.reason:
                    view.reason_since = event.occurred_at
                view.pending(event.reason, event.message, node_counts=dict(event.node_counts), waiting_for=[])
                view.note(event.occurred_at, "unschedulable", event.message)
            case JobScheduled():
                _scheduled(view, event)
            case JobRunning():
                view.running_at = event.occurred_at
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
                if event.shard_index == 0:
                    view.series.add(_series_point(view, event))
                    view.sync_pace.observe(event.attempt, event.step, event.syncs)
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
                if event.cause is FailureCause.SYNC_TIMEOUT:
                    view.sync_timeout = event
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

    def summary_json(self) -> dict[str, Any]:
        """The cluster at a glance, for the dashboard's header: one request instead of folding every node and job
        in the browser each second."""
        nodes = list(self.nodes.values())
        gpus = [gpu for node in nodes for gpu in node.gpus]
        return {
            "jobs": self.counts(),
            "active_jobs": self.active_jobs(),
            "nodes": {status.value: sum(1 for n in nodes if n.status is status) for status in NodeStatus},
            "draining": sum(1 for n in nodes if n.draining),
            "gpus": len(gpus),
            "gpus_allocated": sum(len(n.allocated_gpus) for n in nodes),
            "gpus_unhealthy": sum(1 for gpu in gpus if not gpu.healthy),
            "gpu_utilization": sum(gpu.utilization for gpu in gpus) / len(gpus) if gpus else None,
            "spare_ratio": self.spare_ratio,
            "failure_rate": self.failure_rate,
            "preemptions": self.preemptions,
            "recoveries": self.recoveries,
            "cancellations": self.cancellations,
            "dead_letters": self.dead_letters,
        }
