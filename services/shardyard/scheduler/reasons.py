"""Why each pending job is not placed. Every cycle decides for every pending job again, so the reason each job was
last shown with is kept and only a change is published; the cycle's verdicts are kept too, for the autoscaler's
signals (see ``elasticity``). Pure: time comes in.
"""

from dataclasses import dataclass, field
from datetime import datetime

from shardyard.events import Event, JobSpec, JobUnschedulable, PendingReason
from shardyard.placement.model import PendingJob, Unschedulable


@dataclass
class PendingReasons:
    shown: dict[str, tuple[PendingReason, str, datetime | None]] = field(default_factory=dict)
    """Job -> the (reason, message, estimated start) of its last ``JobUnschedulable``, until it is placed or ends."""
    blocked: list[tuple[JobSpec, PendingReason, datetime]] = field(default_factory=list)
    """(spec, reason, ready since) of each job the last cycle could not place."""

    def new_cycle(self) -> None:
        self.blocked = []

    def unschedulable(self, decision: Unschedulable, job: PendingJob, now: datetime) -> list[Event]:
        """Take in the cycle's verdict on ``job``; a ``JobUnschedulable`` when its reason or message changed."""
        self.blocked.append((job.spec, decision.reason, job.ready_at))
        shown = (decision.reason, decision.message, decision.estimated_start)
        if self.shown.get(decision.job_id) == shown:
            return []
        self.shown[decision.job_id] = shown
        return [
            JobUnschedulable(
                occurred_at=now,
                job_id=decision.job_id,
                reason=decision.reason,
                message=decision.message,
                node_counts=decision.node_counts,
                estimated_start=decision.estimated_start,
            )
        ]

    def forget(self, job_id: str) -> None:
        """The job was placed, or ended: a later verdict on it is news again."""
        self.shown.pop(job_id, None)
