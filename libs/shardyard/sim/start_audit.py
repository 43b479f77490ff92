"""The audit of start estimates: every estimate the ``shardyard`` policy issues in a replay, held against when each
job actually started (``shardyard simulate --json``'s ``start_estimates``).

The core estimates starts as the scheduler service does (``placement.intervals``), in the cycles the audit asks for:
each instant a job arrives (its estimate at submission), and every :data:`REISSUE_S` simulated seconds (as the
service re-issues a job's estimate once it moved). The estimate in force at an instant is the last issued at or
before it.

Per job that waited at least :data:`WAITED_S` (submission to first start), at submission and at the halfway point
of its wait:

- ``median_abs_error_ratio``: the median of |estimated p50 - actual start| / the job's whole wait;
- ``p90_coverage``: the share of those jobs that started no later than their p90;
- ``p90_too_wide_ratio``: the median of (p90 - actual start) / the wait, over the jobs it covered (how much
  later than needed the p90 was);
- ``estimated``: how many of the jobs had an estimate then (a job beyond the plan's first
  ``Policy.start_estimates``, or one whose start the plan cannot see, has none: the figures are over the others;
  a p90 of "not within the plan" counts as covering).
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from statistics import median
from typing import Any

from shardyard.placement.model import Decision, Unschedulable
from shardyard.sim.lost_work import US

WAITED_S = 60.0
REISSUE_S = 300.0
TARGET_ERROR = 0.2
TARGET_COVERAGE = (0.8, 0.95)
MICROSECOND = timedelta(microseconds=1)

Issued = tuple[int, int | None, int | None]
"""(issued at, p50, p90): simulated microseconds; None: not within the plan."""


@dataclass
class StartAudit:
    oracle: bool = False
    """The estimates are made from every job's true run time (``--start-estimates-oracle``): what is left of their
    error is the draws' model of the queue, not the run times' spread."""
    reissue_us: int = int(REISSUE_S * US)
    issued: dict[str, list[Issued]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    last_us: int | None = None

    def due(self, pending: Iterable[str], now_us: int) -> bool:
        """Whether this cycle estimates: a job arrived since the last cycle, or ``reissue_us`` passed."""
        new = [job_id for job_id in pending if job_id not in self.seen]
        self.seen.update(new)
        if new or self.last_us is None or now_us - self.last_us >= self.reissue_us:
            self.last_us = now_us
            return True
        return False

    def record(self, decisions: Sequence[Decision], now_us: int, epoch: datetime) -> None:
        """The cycle's estimates; ``epoch``: simulated time 0 as the decisions' datetimes."""
        for d in decisions:
            if isinstance(d, Unschedulable) and d.estimated_start is not None:
                p50 = (d.estimated_start - epoch) // MICROSECOND
                p90 = None if d.estimated_start_p90 is None else (d.estimated_start_p90 - epoch) // MICROSECOND
                self.issued.setdefault(d.job_id, []).append((now_us, p50, p90))

    def report(self, submitted_us: Mapping[str, int], started_us: Mapping[str, int | None]) -> dict[str, Any]:
        """The audit's figures (see the module's doc) over the jobs that waited at least :data:`WAITED_S`."""
        waited = {
            job_id: (submitted, start)
            for job_id, submitted in submitted_us.items()
            if (start := started_us.get(job_id)) is not None and start - submitted >= WAITED_S * US
        }
        at_submission = [self._judged(job_id, s, a, s) for job_id, (s, a) in waited.items()]
        halfway = [self._judged(job_id, s, a, s + (a - s) // 2) for job_id, (s, a) in waited.items()]
        out: dict[str, Any] = {"oracle": self.oracle, "jobs": len(waited), "at_submission": _figures(at_submission)}
        out["halfway"] = _figures(halfway)
        figures = out["at_submission"]
        out["meets_target"] = (
            None
            if figures["estimated"] == 0
            else figures["median_abs_error_ratio"] <= TARGET_ERROR
            and TARGET_COVERAGE[0] <= figures["p90_coverage"] <= TARGET_COVERAGE[1]
        )
        return out

    def _judged(self, job_id: str, submitted: int, started: int, at_us: int) -> tuple[float, bool, float] | None:
        """(error ratio, covered, p90's slack ratio) of the estimate in force at ``at_us``; None: none was."""
        found = [issued for issued in self.issued.get(job_id, ()) if issued[0] <= at_us]
        if not found or found[-1][1] is None:
            return None
        _, p50, p90 = found[-1]
        assert p50 is not None
        wait = started - submitted
        covered = p90 is None or started <= p90
        slack = 0.0 if p90 is None or not covered else (p90 - started) / wait
        return abs(p50 - started) / wait, covered, slack


def _figures(judged: Sequence[tuple[float, bool, float] | None]) -> dict[str, Any]:
    known = [j for j in judged if j is not None]
    if not known:
        return {"estimated": 0, "median_abs_error_ratio": None, "p90_coverage": None, "p90_too_wide_ratio": None}
    covered = [j[2] for j in known if j[1]]
    return {
        "estimated": len(known),
        "median_abs_error_ratio": round(median(j[0] for j in known), 4),
        "p90_coverage": round(len(covered) / len(known), 4),
        "p90_too_wide_ratio": round(median(covered), 4) if covered else None,
    }
