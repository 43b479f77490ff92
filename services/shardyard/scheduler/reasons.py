"""Why each pending job is not placed. Every cycle decides for every pending job again, so the reason each job was
last shown with is kept and only a change is published; the cycle's verdicts are kept too, for the autoscaler's
signals (see ``elasticity``). Pure: time comes in.

An estimated start moves a little in most cycles (a gang past its expected end pushes it on as time passes), so
it counts as a change only when it moved by more than :data:`ESTIMATE_TOLERANCE` of the wait it predicted (at least
:data:`ESTIMATE_MIN_MOVE_S`), or appeared or went: a job two hours out is republished when its estimate moves by 12
minutes, not every second.
"""

from dataclasses import dataclass, field
from datetime import datetime

from shardyard.events import Event, JobSpec, JobUnschedulable, PendingReason
from shardyard.placement.model import PendingJob, Unschedulable

ESTIMATE_TOLERANCE = 0.1
ESTIMATE_MIN_MOVE_S = 1.0
UNREPORTED_ARTIFACTS_S = 10.0
"""How long a new job's wait for artifacts no agent has reported absent yet goes unsaid: the agents look for a job's
paths when they read its acceptance and report within a heartbeat, so until then "waiting for its data" would be
false (an agent that never reports is said after this long)."""


def _same_estimate(shown: datetime | None, new: datetime | None, now: datetime) -> bool:
    """``new`` says what ``shown`` said: both unknown, or within the tolerance of the wait ``shown`` predicted."""
    if shown is None or new is None:
        return shown is new
    allowed = max(ESTIMATE_MIN_MOVE_S, ESTIMATE_TOLERANCE * (shown - now).total_seconds())
    return abs((new - shown).total_seconds()) <= allowed


@dataclass
class PendingReasons:
    shown: dict[str, tuple[PendingReason, str, datetime | None]] = field(default_factory=dict)
    """Job -> the (reason, message, estimated start) of its last ``JobUnschedulable``, until it is placed or ends."""
    blocked: list[tuple[JobSpec, PendingReason, datetime]] = field(default_factory=list)
    """(spec, reason, ready since) of each job the last cycle could not place."""
    never_fits_since: dict[str, datetime] = field(default_factory=dict)
    """Job -> since when every cycle found it ``NEVER_FITS``, while it does (``past_bound``). Kept by the leader: a
    replica that takes over counts from its first cycle."""

    def new_cycle(self) -> None:
        self.blocked = []

    def unschedulable(self, decision: Unschedulable, job: PendingJob, now: datetime) -> list[Event]:
        """Take in the cycle's verdict on ``job``; a ``JobUnschedulable`` when its reason or message changed."""
        self.blocked.append((job.spec, decision.reason, job.ready_at))
        if decision.reason is PendingReason.NEVER_FITS:
            self.never_fits_since.setdefault(decision.job_id, now)
        else:
            self.never_fits_since.pop(decision.job_id, None)
        unreported = decision.reason is PendingReason.WAITING_FOR_ARTIFACT and not decision.missing
        if unreported and (now - job.ready_at).total_seconds() < UNREPORTED_ARTIFACTS_S:
            return []  # not looked for yet: the agents report within a heartbeat
        shown = (decision.reason, decision.message, decision.estimated_start)
        before = self.shown.get(decision.job_id)
        if before is not None and before[:2] == shown[:2] and _same_estimate(before[2], shown[2], now):
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
                missing_artifacts=decision.missing,
            )
        ]

    def forget(self, job_id: str) -> None:
        """The job was placed, or ended: a later verdict on it is news again."""
        self.shown.pop(job_id, None)
        self.never_fits_since.pop(job_id, None)

    def past_bound(self, now: datetime, bound_s: float) -> list[tuple[str, str]]:
        """(job, the reason's last message) of each job that has never fitted for ``bound_s`` (0: no bound)."""
        if bound_s <= 0:
            return []
        return [
            (job_id, self.shown[job_id][1] if job_id in self.shown else "")
            for job_id, since in self.never_fits_since.items()
            if (now - since).total_seconds() >= bound_s
        ]
