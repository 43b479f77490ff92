"""When will each waiting job start? A conservative plan of the cluster's GPUs over time, as Slurm's
``squeue --start`` gives from its backfill plan. Pure: the cycle's snapshot, decisions and ``now`` come in.

Per group of interchangeable nodes (one GPU model and TFLOPS figure, on nodes that are alive and not draining) the
plan keeps how many GPUs are free from each time on: those free after this cycle's placements; each running gang's
from its expected end (:func:`~shardyard.placement.worth.overrun_end`; never, for a gang with none); each gang
placed this cycle's from its expected run. The waiting jobs then take, in queue order, the earliest time from which
the groups they may use together have their GPUs (shards and spares) free for their expected run (for ever, for a
job with none), and hold them in the plan for that long. So a job's estimate allows for every job ahead of it, and
a job that holds a reservation keeps the time the reservation gave it.

Where an estimate is early: the plan counts GPUs per group, not per node, so a gang that must pack its shards onto
nodes with memory and CPU to spare may start later; load and artifacts are left out; a job that arrives later and
goes ahead (a higher priority, a new job under least attained service) delays it. Where it is late: gangs that end
before their expected end, as most do under a high-quantile estimate. Only the first ``Policy.start_estimates`` jobs
waiting on capacity are planned; the others, and jobs waiting on anything else (an artifact, a GPU model the cluster
lacks, a retry backoff), get no estimate.
"""

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shardyard.events import NodeStatus
from shardyard.gpus import canonical_model
from shardyard.placement.model import NodeView

NEVER = math.inf
GroupKey = tuple[str, float]


@dataclass
class Timeline:
    """Free GPUs of one group as a step function of time (seconds from the cycle's ``now``): ``free[i]`` holds from
    ``times[i]`` until ``times[i + 1]``."""

    times: list[float] = field(default_factory=lambda: [0.0])
    free: list[int] = field(default_factory=lambda: [0])

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

    def lowest(self, start: float, end: float) -> int:
        """The fewest GPUs free at any time in ``[start, end)``."""
        i = bisect.bisect_right(self.times, start) - 1
        low = self.free[i]
        for j in range(i + 1, len(self.times)):
            if self.times[j] >= end:
                break
            low = min(low, self.free[j])
        return low


@dataclass(frozen=True)
class Waiting:
    """A job waiting on capacity, as the plan needs it."""

    job_id: str
    gpus: int
    """Its shards and spares."""
    groups: Sequence[GroupKey]
    """The groups it may use, best match first."""
    run_s: float | None
    """Its expected run; None: unknown (it holds its GPUs for ever in the plan)."""
    reserved_start: datetime | None = None
    """A start its reservation already gave it: kept, and held in the plan from then."""


class StartPlan:
    def __init__(self, now: datetime) -> None:
        self.now = now
        self.groups: dict[GroupKey, Timeline] = {}

    def offset(self, when: datetime | None) -> float:
        """``when`` in seconds from ``now`` (0 for the past; never for None)."""
        return NEVER if when is None else max(0.0, (when - self.now).total_seconds())

    def timeline(self, key: GroupKey) -> Timeline:
        return self.groups.setdefault(key, Timeline())

    def start(self, job: Waiting) -> datetime | None:
        """Plan ``job``: its estimated start (None: not within the plan), its GPUs held from then."""
        groups = [self.groups[key] for key in job.groups if key in self.groups]
        if not groups or job.gpus <= 0:
            return None
        length = NEVER if job.run_s is None else max(job.run_s, 0.0)
        if job.reserved_start is not None:  # its start is the reservation's: hold what is free then
            self._hold(groups, job.gpus, self.offset(job.reserved_start), length)
            return job.reserved_start
        for at in sorted({t for timeline in groups for t in timeline.times}):
            if sum(max(timeline.lowest(at, at + length), 0) for timeline in groups) >= job.gpus:
                self._hold(groups, job.gpus, at, length)
                return self.now + timedelta(seconds=at)
        return None

    @staticmethod
    def _hold(groups: Sequence[Timeline], gpus: int, at: float, length: float) -> None:
        for timeline in groups:
            taken = min(max(timeline.lowest(at, at + length), 0), gpus)
            timeline.add(-taken, at, at + length)
            gpus -= taken
            if gpus == 0:
                return


def plan_starts(
    nodes: Sequence[NodeView],
    releases: Iterable[tuple[str, int, datetime | None]],
    placed: Iterable[tuple[str, int, float | None]],
    waiting: Sequence[Waiting],
    *,
    now: datetime,
) -> dict[str, datetime | None]:
    """The estimated start of each of ``waiting`` (in queue order).

    ``releases``: (node id, GPUs, expected end or None) of the running gangs; ``placed``: (node id, GPUs, expected
    run or None) of the gangs placed this cycle."""
    plan = StartPlan(now)
    node_group: dict[str, GroupKey] = {}
    for view in nodes:
        if view.status is NodeStatus.ALIVE and not view.draining:
            group = node_group[view.node_id] = (canonical_model(view.gpu_model), view.tflops)
            plan.timeline(group).add(len(view.free_gpus), 0.0)
    for node_id, gpus, end in releases:
        releasing = node_group.get(node_id)
        if releasing is not None and end is not None:
            plan.timeline(releasing).add(gpus, plan.offset(end))
    for node_id, gpus, run_s in placed:
        taking = node_group.get(node_id)
        if taking is not None:
            plan.timeline(taking).add(-gpus, 0.0, NEVER if run_s is None else max(run_s, 0.0))
    return {job.job_id: plan.start(job) for job in waiting}
