"""The waiting jobs' starts in one draw of the run times, by playing the core's own rule forward: EASY backfill (one
reservation, ``Policy.reservations``), not a plan in which every job holds its place. Pure.

From now on, at each instant GPUs come free (a gang's end, drawn), the queue is walked in order, as a cycle does:

- a job that fits starts (it takes the GPUs free in its groups, best match first);
- the first job that does not fit gets the reservation: the earliest instant the ends already known give it its
  GPUs (its *shadow* start), and the GPUs then free beyond its need (*extra*);
- a later job starts now only if it fits and does not delay the reservation: it ends by the shadow start, or it
  takes no more than the extra (the core's time-aware backfill: a job expected to end before a reservation starts
  may use the reserved nodes; any job may use the others).

The reservation is taken afresh at every instant, by GPU counts: the core's sits on nodes, but it moves when GPUs
come free elsewhere first. (Holding the reserving job to the end of the last gang on its reserved nodes made the
audit's median error on the homogeneous trace at load 1.1, given the true run times, 0.62 instead of 0.42.)

A conservative plan (every job holding its place, Slurm's ``squeue --start``) says a small job waits behind a wide
one; the core starts it in the gap. So that plan was late for small jobs and early for wide ones even when told
every job's true run time: in the simulator's audit (issue 37), its median error was 0.71 and 0.62 of the wait on
the homogeneous and wide traces at load 1.1 given the true run times, this one's 0.42 and 0.31 (both uncorrected,
``placement.calibration``).
"""

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NEVER = math.inf
GroupKey = tuple[str, float]
"""A group of interchangeable nodes: GPU model and TFLOPS figure."""

Release = tuple[float, int, GroupKey, int]
"""(when, who: a release's or a job's index, group, GPUs) of GPUs coming free."""


@dataclass(frozen=True)
class Job:
    gpus: int
    groups: Sequence[GroupKey]
    """The groups it may use, best match first."""
    run: float
    """Its run in this draw (``NEVER``: it holds its GPUs for ever)."""


def easy_starts(
    free: Mapping[GroupKey, int], releases: Sequence[tuple[float, GroupKey, int]], jobs: Sequence[Job]
) -> list[float]:
    """Each of ``jobs``' start (in queue order) in seconds from now; ``NEVER``: not while the GPUs it needs are held
    for ever. ``free``: GPUs free now per group; ``releases``: (when, group, GPUs) of the gangs' ends."""
    now_free = dict(free)
    heap: list[Release] = [(at, i, key, gpus) for i, (at, key, gpus) in enumerate(releases) if at != NEVER]
    heapq.heapify(heap)
    starts = [NEVER] * len(jobs)
    left = [i for i, job in enumerate(jobs) if job.gpus > 0 and job.groups]
    t = 0.0
    while left:
        while heap and heap[0][0] <= t:
            _, _, key, gpus = heapq.heappop(heap)
            now_free[key] = now_free.get(key, 0) + gpus
        if any(now_free.values()):  # else nothing starts at this instant
            left = _walk(t, now_free, heap, jobs, left, starts)
        if not heap:
            break
        t = heap[0][0]
    return starts


def _walk(
    t: float, free: dict[GroupKey, int], heap: list[Release], jobs: Sequence[Job], left: list[int], starts: list[float]
) -> list[int]:
    """One instant: the queue walked in order (see the module's doc); the jobs still waiting after it."""
    head: Job | None = None  # the reserving job, and its shadow start and extra once a later job needs them
    shadow: tuple[float, int] | None = None
    still = []
    for i in left:
        job = jobs[i]
        if sum(free.get(key, 0) for key in job.groups) < job.gpus:
            still.append(i)
            head = head or job
            continue
        if head is not None and not set(head.groups).isdisjoint(job.groups):
            shadow = shadow or _shadow(free, heap, head)
            if t + job.run > shadow[0]:
                if job.gpus > shadow[1]:
                    still.append(i)
                    continue
                shadow = (shadow[0], shadow[1] - job.gpus)
        starts[i] = t
        for key, taken in _take(free, job.groups, job.gpus):
            if job.run != NEVER:
                heapq.heappush(heap, (t + job.run, i, key, taken))
    return still


def _take(free: dict[GroupKey, int], groups: Sequence[GroupKey], gpus: int) -> list[tuple[GroupKey, int]]:
    """Take ``gpus`` from ``groups`` in order; what each gave."""
    taken = []
    for key in groups:
        give = min(free.get(key, 0), gpus)
        if give > 0:
            free[key] -= give
            taken.append((key, give))
            gpus -= give
        if gpus == 0:
            break
    return taken


def _shadow(free: Mapping[GroupKey, int], heap: Sequence[Release], job: Job) -> tuple[float, int]:
    """The earliest instant the known ends give ``job`` its GPUs, and the GPUs then free in its groups beyond them;
    (``NEVER``, 0): none does."""
    have = sum(free.get(key, 0) for key in job.groups)
    wanted = set(job.groups)
    ahead = list(heap)  # a heap already: popped in time order until enough come free
    while ahead:
        at, _, key, count = heapq.heappop(ahead)
        if key in wanted:
            have += count
            if have >= job.gpus:
                return at, have - job.gpus
    return NEVER, 0
