"""Why each pending job is not placed. Every cycle decides for every pending job again, so the reason each job was
last shown with is kept and only a change is published; the cycle's verdicts are kept too, for the autoscaler's
signals (see ``elasticity``). Pure: time comes in.

A job waiting on capacity carries two estimated starts: the median (p50) and the p90 (by when 90 % of the plan's
samples of the gangs' run times have it started). Each moves a little in most cycles (a gang past its expected end
pushes it on as time passes), so it counts as a change only when it moved by more than :data:`ESTIMATE_TOLERANCE` of
the wait it predicted (at least :data:`ESTIMATE_MIN_MOVE_S`), or appeared or went: a job two hours out is republished
when either estimate moves by 12 minutes, not every second. A republished job carries both as they are now.

The estimates' plan is drawn over many samples (``placement.intervals``), too dear to make every second on a large
cluster: a cycle makes them (:meth:`PendingReasons.estimating`) when a job waits that has none yet, and otherwise
every :data:`ESTIMATE_EVERY_S`; in between, each job keeps the estimates it was last shown with. The estimates are
corrected by how the earlier ones erred (``placement.calibration``), learned from the jobs this replica placed.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from shardyard.events import Event, JobSpec, JobUnschedulable, PendingReason
from shardyard.placement.calibration import StartCalibration
from shardyard.placement.model import Decision, PendingJob, Unschedulable

ESTIMATE_TOLERANCE = 0.1
ESTIMATE_MIN_MOVE_S = 1.0
ESTIMATE_EVERY_S = 10.0
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


class Shown(NamedTuple):
    """What a job's ``JobUnschedulable`` said."""

    reason: PendingReason
    message: str
    start: datetime | None
    """The p50 estimated start."""
    start_p90: datetime | None
    """The p90 estimated start."""

    def says(self, new: "Shown", now: datetime) -> bool:
        """``new`` says what this said: the same reason and message, and each estimate within its tolerance."""
        return (
            (self.reason, self.message) == (new.reason, new.message)
            and _same_estimate(self.start, new.start, now)
            and _same_estimate(self.start_p90, new.start_p90, now)
        )


@dataclass
class PendingReasons:
    shown: dict[str, Shown] = field(default_factory=dict)
    """Job -> what its last ``JobUnschedulable`` said, until it is placed or ends."""
    blocked: list[tuple[JobSpec, PendingReason, datetime]] = field(default_factory=list)
    """(spec, reason, ready since) of each job the last cycle could not place."""
    never_fits_since: dict[str, datetime] = field(default_factory=dict)
    """Job -> since when every cycle found it ``NEVER_FITS``, while it does (``past_bound``). Kept by the leader: a
    replica that takes over counts from its first cycle."""

    estimated_at: datetime | None = None
    """When a cycle last made start estimates."""
    estimated: set[str] = field(default_factory=set)
    """The jobs that cycle decided for."""
    estimates_now: bool = True
    calibration: StartCalibration = field(default_factory=StartCalibration)
    """The estimates' correction, learned from the starts that followed them (``placement.calibration``)."""

    def new_cycle(self) -> None:
        self.blocked = []

    def corrected(self, decisions: Sequence[Decision], now: datetime) -> list[Decision]:
        """The cycle's decisions, their estimates corrected by what earlier ones missed (this cycle made any)."""
        return self.calibration.corrected(decisions, now) if self.estimates_now else list(decisions)

    def placed(self, job_id: str, now: datetime) -> None:
        """``job_id`` was placed now: its first estimate's error teaches the calibration."""
        self.calibration.started(job_id, now)

    def estimating(self, pending: Iterable[str], now: datetime) -> bool:
        """Whether this cycle makes start estimates (see the module's doc); remembered for its verdicts."""
        waiting = set(pending)
        due = self.estimated_at is None or (now - self.estimated_at).total_seconds() >= ESTIMATE_EVERY_S
        self.estimates_now = due or not waiting <= self.estimated
        if self.estimates_now:
            self.estimated_at, self.estimated = now, waiting
        return self.estimates_now

    def unschedulable(self, decision: Unschedulable, job: PendingJob, now: datetime) -> list[Event]:
        """Take in the cycle's verdict on ``job``; a ``JobUnschedulable`` when its reason or message changed, or an
        estimated start moved (``Shown.says``)."""
        self.blocked.append((job.spec, decision.reason, job.ready_at))
        if decision.reason is PendingReason.NEVER_FITS:
            self.never_fits_since.setdefault(decision.job_id, now)
        else:
            self.never_fits_since.pop(decision.job_id, None)
        unreported = decision.reason is PendingReason.WAITING_FOR_ARTIFACT and not decision.missing
        if unreported and (now - job.ready_at).total_seconds() < UNREPORTED_ARTIFACTS_S:
            return []  # not looked for yet: the agents report within a heartbeat
        before = self.shown.get(decision.job_id)
        if self.estimates_now or before is None:
            shown = Shown(decision.reason, decision.message, decision.estimated_start, decision.estimated_start_p90)
        else:  # no estimates made this cycle: it keeps those it was shown with
            shown = Shown(decision.reason, decision.message, before.start, before.start_p90)
        if before is not None and before.says(shown, now):
            return []
        self.shown[decision.job_id] = shown
        return [
            JobUnschedulable(
                occurred_at=now,
                job_id=decision.job_id,
                reason=decision.reason,
                message=decision.message,
                node_counts=decision.node_counts,
                estimated_start=shown.start,
                estimated_start_p90=shown.start_p90,
                missing_artifacts=decision.missing,
            )
        ]

    def forget(self, job_id: str) -> None:
        """The job was placed, or ended: a later verdict on it is news again (a placement has taught the
        calibration already: ``placed``)."""
        self.calibration.forget(job_id)
        self.shown.pop(job_id, None)
        self.never_fits_since.pop(job_id, None)

    def past_bound(self, now: datetime, bound_s: float) -> list[tuple[str, str]]:
        """(job, the reason's last message) of each job that has never fitted for ``bound_s`` (0: no bound)."""
        if bound_s <= 0:
            return []
        return [
            (job_id, self.shown[job_id].message if job_id in self.shown else "")
            for job_id, since in self.never_fits_since.items()
            if (now - since).total_seconds() >= bound_s
        ]
