"""A job's training progress as the monitor keeps it between reports: the loss and throughput series the dashboard
charts, and the pace of parameter syncs the SLOW_SYNC rule reads. Pure: reports in, figures out. The job that holds
both is ``monitor/jobs.py``."""

import math
from dataclasses import dataclass, field
from typing import Any

SERIES_POINTS = 512
"""Points of a job's progress series: about a chart's width in pixels, small enough to poll every second."""

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

    def end(self, step: int, loss: float) -> None:
        """The run ended at ``step`` on ``loss`` (the job's final loss): the newest point becomes that, at the time
        and throughput of the last report, so that the curve ends where the job did, on the number it reports."""
        if self.latest is None:
            return
        if self.points and self.points[-1] == self.latest:
            self.points.pop()
        self.points = [p for p in self.points if p[0] < step]
        self.latest = (step, self.latest[1], loss, self.latest[3])

    def columns(self) -> dict[str, Any]:
        """Column arrays (``step``, ``t_s``, ``loss``, ``samples_per_s``): the shape a chart walks, and compact."""
        points = list(self.points)
        if self.latest is not None and (not points or points[-1] != self.latest):
            points.append(self.latest)
        step, t_s, loss, rate = (list(column) for column in zip(*points, strict=True)) if points else ([], [], [], [])
        return {"stride": self.stride, "step": step, "t_s": t_s, "loss": _finite(loss), "samples_per_s": _finite(rate)}


@dataclass
class SyncPace:
    """Steps between parameter syncs as rank 0's progress reports show them (the reports do not carry the interval).

    Reports come at most every 0.5 s, so the step at which the sync count is seen to rise lags the sync by up to that
    many steps; the gap between two such sightings is the interval give or take those steps. The first sighting of
    an attempt only marks the start, since the report before it need not have been a sync."""

    attempt: int = 0
    syncs: int = 0
    step: int = 0
    at_sync: bool = False
    steps_per_sync: float | None = None

    def observe(self, attempt: int, step: int, syncs: int) -> None:
        if attempt != self.attempt or syncs < self.syncs:
            self.attempt, self.syncs, self.step, self.at_sync, self.steps_per_sync = attempt, syncs, step, False, None
            return
        if syncs > self.syncs:
            if self.at_sync:
                self.steps_per_sync = (step - self.step) / (syncs - self.syncs)
            self.syncs, self.step, self.at_sync = syncs, step, True


def _finite(values: list[float]) -> list[float | None]:
    """A diverged run's NaN or inf as null: JSON has no such numbers, and one would break the whole response."""
    return [v if math.isfinite(v) else None for v in values]
