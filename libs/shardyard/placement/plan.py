"""The plan start estimates are made on: the cluster's GPUs over time, as Slurm's ``squeue --start`` gives from its
backfill plan. Pure. ``shardyard.placement.intervals`` builds one per sample of the gangs' run times.

Per group of interchangeable nodes (one GPU model and TFLOPS figure, on nodes that are alive and not draining) the
plan keeps how many GPUs are free from each time on: those free after this cycle's placements, and each gang's from
its end. The waiting jobs then take, in queue order, the earliest time from which the groups they may use together
have their GPUs free for their run (for ever, for a job with none), and hold them in the plan for that long. So a
job's estimate allows for every job ahead of it.

Where an estimate is early: the plan counts GPUs per group, not per node, so a gang that must pack its shards onto
nodes with memory and CPU to spare may start later; load and artifacts are left out; a job that arrives later and
goes ahead (a higher priority, a new job under least attained service) delays it. Only the first
``Policy.start_estimates`` jobs waiting on capacity are planned; the others, and jobs waiting on anything else (an
artifact, a GPU model the cluster lacks, a retry backoff), get no estimate.
"""

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

NEVER = math.inf
GroupKey = tuple[str, float]


@dataclass
class Timeline:
    """Free GPUs of one group as a step function of time (seconds from the cycle's ``now``): ``free[i]`` holds from
    ``times[i]`` until ``times[i + 1]``."""

    times: list[float] = field(default_factory=lambda: [0.0])
    free: list[int] = field(default_factory=lambda: [0])

    @classmethod
    def of(cls, changes: Iterable[tuple[float, int]]) -> "Timeline":
        """The timeline of ``changes``: (from when, GPUs more free from then on), in any order. Sorted once: adding
        a thousand gangs' ends one by one would walk the steps after each."""
        line = cls()
        for at, gpus in sorted(changes):
            if at == line.times[-1]:
                line.free[-1] += gpus
            else:
                line.times.append(at)
                line.free.append(line.free[-1] + gpus)
        return line

    def _split(self, at: float) -> int:
        """The index of the step that starts at ``at`` (made if need be)."""
        i = bisect.bisect_right(self.times, at) - 1
        if self.times[i] == at:
            return i
        self.times.insert(i + 1, at)
        self.free.insert(i + 1, self.free[i])
        return i + 1

    def add(self, gpus: int, start: float, end: float = NEVER) -> None:
        """``gpus`` more free over ``[start, end)`` (fewer, for a negative count)."""
        if gpus == 0 or end <= start:
            return
        first = self._split(start)
        last = self._split(end) if end != NEVER else len(self.times)
        for i in range(first, last):
            self.free[i] += gpus

    def earliest(self, gpus: int, length: float) -> float | None:
        """The first step's start from which ``gpus`` are free for ``length`` (None: never). A step too low rules
        out every start before its end, so the scan resumes after it: one pass over the steps."""
        times, free, i, n = self.times, self.free, 0, len(self.times)
        while i < n:
            start, j = times[i], i
            while j < n and times[j] < start + length and free[j] >= gpus:
                j += 1
            if j == n or times[j] >= start + length:
                return start
            i = j + 1
        return None

    def lowest(self, start: float, end: float) -> int:
        """The fewest GPUs free at any time in ``[start, end)``."""
        i = bisect.bisect_right(self.times, start) - 1
        j = bisect.bisect_left(self.times, end, lo=i + 1)
        return min(self.free[i:j]) if j > i else self.free[i]


class StartPlan:
    def __init__(self, now: datetime) -> None:
        self.now = now
        self.groups: dict[GroupKey, Timeline] = {}

    def timeline(self, key: GroupKey) -> Timeline:
        return self.groups.setdefault(key, Timeline())

    def earliest(self, groups: Sequence[Timeline], gpus: int, length: float) -> float | None:
        """The earliest time (seconds from now) from which ``groups`` together have ``gpus`` free for ``length``,
        those GPUs then held; None: never."""
        if len(groups) == 1:
            at = groups[0].earliest(gpus, length)
        else:
            at = next(
                (
                    t
                    for t in sorted({t for timeline in groups for t in timeline.times})
                    if sum(max(timeline.lowest(t, t + length), 0) for timeline in groups) >= gpus
                ),
                None,
            )
        if at is not None:
            self.hold(groups, gpus, at, length)
        return at

    @staticmethod
    def hold(groups: Sequence[Timeline], gpus: int, at: float, length: float) -> None:
        for timeline in groups:
            taken = min(max(timeline.lowest(at, at + length), 0), gpus)
            timeline.add(-taken, at, at + length)
            gpus -= taken
            if gpus == 0:
                return
