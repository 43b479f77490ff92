"""One job as the monitor shows it, folded from its lifecycle and shard events. Pure: events in, JSON-ready views out.

The transition table (``shardyard.lifecycle``) keeps a job where it is on a late or duplicated event; everything else
a job shows (its pending reason, placements, timeline, progress series, the figures the alert rules read) is folded
here; the progress series and sync pace it keeps are ``monitor/progress.py``. The cluster-wide picture that holds
the jobs is ``monitor/views.py``.
"""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shardyard.events import (
    FailureCause,
    JobAccepted,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPreempted,
    JobPreempting,
    JobReady,
    JobRecovering,
    JobRejected,
    JobResized,
    JobRunning,
    JobScheduled,
    JobStraggling,
    JobSucceeded,
    JobUnschedulable,
    JobWaiting,
    RejectReason,
    ShardCompleted,
    ShardFailed,
    ShardProgress,
    ShardStarted,
)
from shardyard.lifecycle import TERMINAL, JobState, LifecycleFact, can_move, moves, target_state
from shardyard.monitor.progress import SERIES_POINTS as SERIES_POINTS  # re-exported: its home was here
from shardyard.monitor.progress import ProgressSeries, SeriesPoint, SyncPace
from shardyard.monitor.public import REDACTED as REDACTED  # re-exported: its home was here
from shardyard.monitor.public import public_spec
from shardyard.monitor.requeues import Requeues
from shardyard.monitor.timeline import MAX_NOTES, Timeline

MAX_TIMELINE = MAX_NOTES
MAX_SERIES = 2000
ENDED_SHARD = frozenset({"COMPLETED", "FAILED"})  # shard states whose throughput no longer counts towards the gang's

ShardFact = ShardStarted | ShardProgress | ShardCompleted | ShardFailed


@dataclass
class JobView(Requeues):
    job_id: str
    state: JobState | None = None
    reason: str | None = None
    message: str = ""
    node_counts: dict[str, int] = field(default_factory=dict)
    """Nodes excluded, by the scheduler's filter, behind the current pending reason."""
    waiting_for: list[str] = field(default_factory=list)
    """Parent jobs the queue holds this one for; or, WAITING_FOR_ARTIFACT, the paths it waits on."""
    missing_artifacts: list[dict[str, Any]] = field(default_factory=list)
    """WAITING_FOR_ARTIFACT: each path it waits on, with the nodes lacking it and where they mount it."""
    estimated_start: datetime | None = None
    """When the scheduler expects it to start (the median, p50), from its reservation or the plan, while it waits on
    capacity."""
    estimated_start_p90: datetime | None = None
    """By when the scheduler expects it started in 90 % of the plan's samples; set and cleared with the p50."""
    spec: dict[str, Any] | None = None
    attempt: int = 0
    placed_term: int = 0
    """The scheduler term of the job's newest placement: a placement under a lower one is a deposed leader's."""
    submitted_at: datetime | None = None
    first_step_at: datetime | None = None
    ended_at: datetime | None = None
    final_loss: float | None = None
    checkpoint_dir: str | None = None
    placements: list[dict[str, Any]] = field(default_factory=list)
    degraded: bool = False
    resume_from: str | None = None
    preempting: tuple[int, str] | None = None
    """(attempt, by job) of the preemption under way, so a redelivered JobPreempting is noted once."""
    recoveries: int = 0
    resizes: int = 0  # times its elastic gang was re-formed at another size (JobResized)
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    """The stragglers the fault manager found in its gangs, and what it did (``JobStraggling``)."""
    last_checkpoint: dict[str, Any] | None = None
    shards: dict[int, dict[str, Any]] = field(default_factory=dict)
    loss: list[tuple[int, float]] = field(default_factory=list)
    series: ProgressSeries = field(default_factory=ProgressSeries)
    timeline: Timeline = field(default_factory=Timeline)
    errors: list[dict[str, Any]] = field(default_factory=list)
    # What the alert rules (monitor/rules.py) read beside the above:
    reason_since: datetime | None = None
    """When the scheduler first gave the current pending reason (set by job.unschedulable only)."""
    running_at: datetime | None = None
    """When the current attempt's gang was last seen RUNNING."""
    sync_timeout: ShardFailed | None = None
    """The newest shard failure of this job by SYNC_TIMEOUT."""
    sync_pace: SyncPace = field(default_factory=SyncPace)

    def pending(
        self,
        reason: str | None,
        message: str,
        *,
        node_counts: dict[str, int],
        waiting_for: list[str],
        missing: list[dict[str, Any]] | None = None,
    ) -> None:
        """Set the current reason (None: none) with its details; every other detail of the last one goes."""
        self.reason, self.message = reason, message
        self.node_counts, self.waiting_for, self.missing_artifacts = node_counts, waiting_for, missing or []
        self.estimated_start = self.estimated_start_p90 = None

    def note(self, at: datetime, what: str, detail: str = "", *, attempt: int | None = None) -> None:
        """A timeline note of ``attempt`` (None: the job's current one); the timeline puts it in its place."""
        self.timeline.note(at, what, detail, attempt=self.attempt if attempt is None else attempt)

    # --- folding ------------------------------------------------------------------------------------------------
    def fold_lifecycle(self, event: LifecycleFact) -> bool:
        """Fold a lifecycle fact; False when the transition table refused it (late, duplicated, or a resubmission
        refused), so that the cluster counts each preemption, recovery and cancellation once."""
        target = target_state(event)
        if isinstance(event, JobRejected) and (
            event.reason is RejectReason.DUPLICATE_JOB or not can_move(self.state, JobState.REJECTED)
        ):
            self.note(event.occurred_at, "resubmission refused", f"{event.reason}: {event.message}")
            return False
        if isinstance(event, JobWaiting) and self.state is JobState.WAITING:
            self._waiting(event)  # a held job's new reason: no move
            return False
        if isinstance(event, JobScheduled) and event.term < self.placed_term:
            # Fenced, as the scheduler fences it (shardyard.scheduler.fencing): it moves and shows nothing.
            detail = f"attempt {event.attempt} under term {event.term}: term {self.placed_term} placed the job"
            self.note(event.occurred_at, "stale placement fenced", detail)
            return False
        if target is not None and moves(self.state, event) is None:
            return False  # late or duplicated: the transition table keeps the job where it is
        if target is not None:
            self.state = target
        self._moved(event)
        return True

    def _moved(self, event: LifecycleFact) -> None:
        """What a fact the table let through shows: one case per fact, the longer ones in methods of their own."""
        match event:
            case JobAccepted():
                self._accepted(event)
            case JobRejected():
                self.pending(event.reason, event.message, node_counts={}, waiting_for=[])
                self.errors = [e.model_dump() for e in event.errors]
                self.ended_at = event.occurred_at
                self.note(event.occurred_at, "rejected", f"{event.reason}: {event.message}")
            case JobWaiting():
                self._waiting(event)
            case JobReady():
                self.pending(None, "", node_counts={}, waiting_for=[])
                self.note(event.occurred_at, "ready", "dependencies met; waiting for placement")
            case JobUnschedulable():
                self._unschedulable(event)
            case JobScheduled():
                self._scheduled(event)
            case JobRunning():
                self.running_at = event.occurred_at
                self.note(event.occurred_at, "running", "every shard started")
            case JobPreempting():
                self._preempting(event)
            case JobPreempted():
                self._preempted(event)
            case JobRecovering():
                self._recovering(event)
            case JobResized():
                self._resized(event)
            case JobStraggling():
                self._straggling(event)
            case JobCancelRequested():
                if self.state is not None and self.state not in TERMINAL:
                    self.note(event.occurred_at, "cancel requested", f"by {event.requested_by}")
            case JobCancelled() | JobSucceeded() | JobFailed():
                self._ended(event)

    def _accepted(self, event: JobAccepted) -> None:
        self.spec = public_spec(event.spec.model_dump(mode="json"))
        self.submitted_at = event.spec.submitted_at
        self.pending(None, "", node_counts={}, waiting_for=[])
        self.errors = []
        self.note(event.occurred_at, "accepted", f"priority {event.spec.priority}")

    def _unschedulable(self, event: JobUnschedulable) -> None:
        if self.reason != event.reason:
            self.reason_since = event.occurred_at  # RESOURCE_SHORTAGE times the reason from its first giving, not each
        self.pending(
            event.reason,
            event.message,
            node_counts=dict(event.node_counts),
            waiting_for=[artifact.path for artifact in event.missing_artifacts],
            missing=[artifact.model_dump(mode="json") for artifact in event.missing_artifacts],
        )
        self.estimated_start, self.estimated_start_p90 = event.estimated_start, event.estimated_start_p90
        self.note(event.occurred_at, "unschedulable", event.message)

    def _ended(self, event: JobCancelled | JobSucceeded | JobFailed) -> None:
        self.ended_at = event.occurred_at
        match event:
            case JobCancelled():
                self.pending("CANCELLED", event.message, node_counts={}, waiting_for=[])
                self.note(event.occurred_at, "cancelled", event.message)
            case JobSucceeded():
                self.final_loss, self.checkpoint_dir = event.final_loss, event.checkpoint_dir
                loss = "-" if event.final_loss is None else f"{event.final_loss:.4g}"
                self.note(event.occurred_at, "succeeded", f"final loss {loss}; checkpoint {event.checkpoint_dir}")
            case JobFailed():
                self.pending(event.cause, event.message, node_counts={}, waiting_for=[])
                self.note(event.occurred_at, "failed", f"{event.cause}: {event.message}")

    def _waiting(self, event: JobWaiting) -> None:
        waiting_for = list(event.waiting_for)
        if (self.reason, self.message, self.waiting_for) == (event.reason, event.message, waiting_for):
            return  # the same reason again
        self.pending(event.reason, event.message, node_counts={}, waiting_for=waiting_for)
        self.note(event.occurred_at, "waiting", event.message)

    def _scheduled(self, event: JobScheduled) -> None:
        self.placed_term = event.term
        self.attempt, self.degraded, self.resume_from = event.attempt, event.degraded, event.resume_from
        self.preempting = None
        self.pending(None, "", node_counts={}, waiting_for=[])
        self.placements = [p.model_dump() for p in event.placements]
        # The rows of this attempt's shards only (an earlier attempt's steps are no news of this one's).
        self.shards = {i: row for i, row in self.shards.items() if row.get("attempt", 0) >= event.attempt}
        where = ", ".join(
            f"shard {p.shard_index} -> {p.node_id} GPU {p.gpu_indices}"
            + (f" degraded (match {p.match_score:.2f})" if p.degraded else "")
            for p in event.placements
        )
        detail = f"attempt {event.attempt}{' (degraded)' if event.degraded else ''}: {where}; "
        detail += f"coordinator {event.coordinator_node}"
        detail += f"; resuming from {event.resume_from}" if event.resume_from else ""
        self.note(event.occurred_at, "scheduled", detail)

    def fold_shard(self, event: ShardFact) -> None:
        if event.attempt < self.attempt:
            return
        shard = self.shards.setdefault(event.shard_index, {"node_id": event.node_id, "state": "STARTING", "step": 0})
        shard["node_id"] = event.node_id
        shard["attempt"] = event.attempt
        match event:
            case ShardStarted():
                shard["state"] = "RUNNING"
                shard["pid"] = event.pid
                note = f"shard {event.shard_index} on {event.node_id}"
                self.note(event.occurred_at, "shard started", note, attempt=event.attempt)
            case ShardProgress():
                self._progress(shard, event)
            case ShardCompleted():
                self._completed(shard, event)
            case ShardFailed():
                shard["state"] = "FAILED"
                shard["cause"] = event.cause
                if event.cause is FailureCause.SYNC_TIMEOUT:
                    self.sync_timeout = event
                detail = f"shard {event.shard_index}: {event.cause}: {event.message}"
                self.note(event.occurred_at, "shard failed", detail, attempt=event.attempt)

    def _progress(self, shard: dict[str, Any], event: ShardProgress) -> None:
        previous_syncs = shard.get("syncs", 0)
        shard.update(
            step=event.step,
            loss=event.loss,
            samples_per_s=event.samples_per_s,
            allreduce_ms=event.allreduce_ms,
            allreduce_bytes=event.allreduce_bytes,
            syncs=event.syncs,
            cpu_percent=event.cpu_percent,
            step_ms=event.step_ms,
            compute_ms=event.compute_ms,
            updated_at=event.occurred_at.isoformat(),
        )
        if self.first_step_at is None:
            self.first_step_at = event.occurred_at
        if event.shard_index != 0:
            return
        if len(self.loss) < MAX_SERIES:
            self.loss.append((event.step, event.loss))
        self.series.add(self._series_point(event))
        self.sync_pace.observe(event.attempt, event.step, event.syncs)
        if event.syncs > previous_syncs:
            detail = (
                f"sync {event.syncs} at step {event.step}: {event.allreduce_ms:.1f} ms, {event.allreduce_bytes} bytes"
            )
            self.note(event.occurred_at, "parameter sync", detail, attempt=event.attempt)

    def _completed(self, shard: dict[str, Any], event: ShardCompleted) -> None:
        """A shard's end: its row shows its own final loss and step. Rank 0's is the job's final loss (the scheduler
        puts it on ``job.succeeded``), so the job's loss curve and series end on it."""
        shard["state"] = "COMPLETED"
        shard["final_loss"] = event.final_loss
        if event.final_loss is not None:
            shard["loss"] = event.final_loss
        if event.steps is not None:
            shard["step"] = event.steps
        loss = "-" if event.final_loss is None else f"{event.final_loss:.4g}"
        self.note(event.occurred_at, "shard completed", f"shard {event.shard_index}: final loss {loss}")
        if event.shard_index != 0 or event.final_loss is None or event.steps is None:
            return
        point = (event.steps, event.final_loss)
        self.loss = [p for p in self.loss if p[0] < event.steps] + [point]
        self.series.end(event.steps, event.final_loss)

    def _series_point(self, event: ShardProgress) -> SeriesPoint:
        """Rank 0's step and loss (every rank trains the same averaged model), with the gang's summed throughput."""
        gang = [s for s in self.shards.values() if s.get("attempt") == event.attempt and s["state"] not in ENDED_SHARD]
        rate = sum(s.get("samples_per_s", 0.0) for s in gang)
        since = (event.occurred_at - self.first_step_at).total_seconds() if self.first_step_at else 0.0
        return (event.step, round(since, 3), event.loss, round(rate, 3))

    # --- JSON views ---------------------------------------------------------------------------------------------
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
            "loss": self._loss(),
            "submitted_at": self.submitted_at.isoformat() if self.submitted_at else None,
            "estimated_start": self.estimated_start.isoformat() if self.estimated_start else None,
            "estimated_start_p90": self.estimated_start_p90.isoformat() if self.estimated_start_p90 else None,
        }

    def _loss(self) -> float | None:
        """The job's loss: its final loss once it succeeded, else rank 0's last report."""
        if self.state is JobState.SUCCEEDED and self.final_loss is not None:
            return self.final_loss
        return self.loss[-1][1] if self.loss else None

    def detail(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "recoveries": self.recoveries,
            "resizes": self.resizes,
            "stragglers": self.stragglers,
            "last_checkpoint": self.last_checkpoint,
            "spec": self.spec,
            "errors": self.errors,
            "node_counts": self.node_counts,
            "waiting_for": self.waiting_for,
            "missing_artifacts": self.missing_artifacts,
            "placements": self.placements,
            "degraded": self.degraded,
            "resume_from": self.resume_from,
            "shards": {str(k): v for k, v in sorted(self.shards.items())},
            "first_loss": self.loss[0][1] if self.loss else None,
            "final_loss": self.final_loss,
            "checkpoint_dir": self.checkpoint_dir,
            "first_step_at": self.first_step_at.isoformat() if self.first_step_at else None,
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "loss_curve": self.loss,
            "timeline": self.timeline.entries(),
        }

    def series_json(self) -> dict[str, Any]:
        """The dashboard's curves, apart from ``detail()`` so that polling them does not resend the timeline."""
        max_steps = self.spec.get("max_steps") if self.spec else None
        return {"job_id": self.job_id, "state": self.state, "max_steps": max_steps, **self.series.columns()}
