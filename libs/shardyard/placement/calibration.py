"""Start estimates checked against the starts that followed, and corrected by what that shows. Pure: decisions,
starts and times come in.

The draws (``placement.intervals``) leave out what the core cannot know: jobs that will arrive and go ahead, gangs
that will be preempted and run again, nodes a gang cannot pack onto. So their estimates run early, and their spread
is narrower than the truth. Rather than guess those, the scheduler measures them: for each job that waited, the
ratio of its actual wait to the wait its first estimate said (at its p50, and at its p90), over the last
:data:`WINDOW` jobs whose first p50 wait fell in the same class (:data:`BUCKETS_S`: a plan that says "a minute"
errs otherwise than one that says "two hours"). Once :data:`MIN_SAMPLES` of a class are known, a new estimate of
that class has its wait scaled by the median ratio (its p50: as likely early as late again) and by the 90th
percentile of the p90 ratios (its p90: by construction, 90 % of the class's recent jobs would have started by it).
This is split conformal prediction with a multiplicative score, one calibration per class (Mondrian conformal
prediction: Vovk, Gammerman and Shafer, *Algorithmic Learning in a Random World*, 2005): it holds as long as the
coming jobs wait as the recent ones did, and re-learns when they stop.

Every estimated job that starts teaches it, however short its wait (learning from long waits alone would scale
up the estimates of jobs that start soon); a wait said as under a second counts as one second.
"""

from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from statistics import median

from shardyard.placement.estimates import nearest_rank
from shardyard.placement.model import Decision, Unschedulable

WINDOW = 200
MIN_SAMPLES = 20
BUCKETS_S = (60.0, 300.0, 1800.0, 7200.0)
"""Edges of the classes of a first estimate's p50 wait: each class learns its own correction."""


@dataclass
class Ratios:
    """Actual wait / estimated wait of the last ``WINDOW`` jobs of one class, at the p50 and at the p90."""

    p50: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    p90: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def factors(self, min_samples: int) -> tuple[float, float] | None:
        if len(self.p50) < min_samples or len(self.p90) < min_samples:
            return None
        return median(self.p50), nearest_rank(sorted(self.p90), 0.9)


@dataclass
class StartCalibration:
    min_samples: int = MIN_SAMPLES
    classes: dict[int, Ratios] = field(default_factory=dict)
    first: dict[str, tuple[datetime, float, float | None]] = field(default_factory=dict)
    """Job -> (when, the p50's and the p90's wait) of its first estimate, uncorrected, until it starts."""

    def factors(self, p50_s: float) -> tuple[float, float]:
        """What an estimate of a p50 wait of ``p50_s`` has its waits scaled by (1, 1 until enough is known)."""
        known = self.classes.get(bisect_right(BUCKETS_S, p50_s))
        found = None if known is None else known.factors(self.min_samples)
        return found or (1.0, 1.0)

    def corrected(self, decisions: Sequence[Decision], now: datetime) -> list[Decision]:
        """``decisions``, each estimate's wait scaled (the first estimate of each job kept, as made, to learn from)."""
        out: list[Decision] = []
        for d in decisions:
            if isinstance(d, Unschedulable) and d.estimated_start is not None:
                p50 = _wait(d.estimated_start, now)
                p90 = None if d.estimated_start_p90 is None else _wait(d.estimated_start_p90, now)
                self.first.setdefault(d.job_id, (now, p50, p90))
                f50, f90 = self.factors(p50)
                d = replace(
                    d,
                    estimated_start=now + timedelta(seconds=p50 * f50),
                    estimated_start_p90=None if p90 is None else now + timedelta(seconds=max(p50 * f50, p90 * f90)),
                )
            out.append(d)
        return out

    def started(self, job_id: str, at: datetime) -> None:
        """``job_id`` was placed at ``at``: how its first estimate erred teaches the correction of its class."""
        first = self.first.pop(job_id, None)
        if first is None:
            return
        since, p50, p90 = first
        waited = max(0.0, (at - since).total_seconds())
        ratios = self.classes.setdefault(bisect_right(BUCKETS_S, p50), Ratios())
        ratios.p50.append(waited / max(p50, 1.0))
        if p90 is not None:
            ratios.p90.append(waited / max(p90, 1.0))

    def forget(self, job_id: str) -> None:
        """The job ended without starting (cancelled, failed): it teaches nothing."""
        self.first.pop(job_id, None)


def _wait(at: datetime, now: datetime) -> float:
    return max(0.0, (at - now).total_seconds())
