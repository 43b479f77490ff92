"""When will each waiting job start, as an interval: the core's queue played forward (``placement.easy``) over
samples of the run times, its p50 and p90 taken per job. Pure: the cycle's gangs, free GPUs, waiting jobs and
``now`` come in.

A gang's run time is not one figure: jobs of one kind run from half to twice as long as each other, and which of
the gangs ahead ends early decides when a waiting job starts. So each of ``Policy.start_samples`` draws takes every
gang's run from its spread (``RunningJob.run_quantiles``, ``PendingJob.run_quantiles``: the run time at the
quantile levels of ``shardyard.placement.estimates``), a running gang's from its runs longer than it has already
run (a gang 3 h into a run of p50 1 h is drawn from its runs longer than 3 h; past all of them, it runs on as long
again as it has run, as ``worth.overrun_end`` expects). Per GPU model and TFLOPS, on the nodes alive and not
draining, the GPUs free now and each gang's from its drawn end then meet the waiting jobs in queue order, by the
core's rule (EASY backfill, ``placement.easy``). A job's p50 is the median of its starts over the draws, its p90
the start by which 90 % of them have it started; one the draws cannot start (a gang ahead runs for ever) has none.

The draws are stratified and fixed: draw ``s`` takes every job at level ``(s + 0.5) / samples`` turned by a hash
of the job's id, so each job's draws cover its spread evenly, different jobs' are not in step, and the same cycle
gives the same estimates again (an estimate moves only when the cluster does). A gang or job without a spread uses
its expected end or run alone; one with neither holds its GPUs for ever.

Where the interval is off: the draws count GPUs per group, not per node, so a gang that must pack its shards onto
nodes with memory and CPU to spare starts later; load and artifacts are left out. Later arrivals that go ahead of a
job (a higher priority, a job of a queue below its fair share) are not in it, so the interval is early under load;
preemption is not in it either, so a job that will preempt (a higher priority, a new job under least attained
service) starts before it. The spreads assume the gangs' run times independent.
"""

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from shardyard.events import NodeStatus
from shardyard.placement.easy import NEVER, GroupKey, Job, easy_starts
from shardyard.placement.index import Slot
from shardyard.placement.model import Policy, RunningJob


@dataclass(frozen=True)
class Queued:
    """A job waiting on capacity, as the draws need it."""

    job_id: str
    gpus: int
    """Its shards (spares are never a reason to wait)."""
    groups: Sequence[GroupKey]
    """The groups it may use, best match first."""
    run_quantiles: Sequence[float]
    """Its run time from a start at each quantile level (empty: ``run_s`` alone)."""
    run_s: float | None
    """Its expected run; None: unknown."""


@dataclass(frozen=True)
class Interval:
    p50: datetime | None
    p90: datetime | None


def free_now(slots: Iterable[Slot]) -> tuple[dict[GroupKey, int], dict[str, GroupKey]]:
    """The GPUs free now per group of the usable nodes (alive, not draining), and each such node's group."""
    free: dict[GroupKey, int] = {}
    groups: dict[str, GroupKey] = {}
    for slot in slots:
        if slot.view.status is NodeStatus.ALIVE and not slot.view.draining:
            key = groups[slot.node_id] = (slot.group.model, slot.group.tflops)
            free[key] = free.get(key, 0) + len(slot.free)
    return free, groups


def per_group(gang: RunningJob, groups: Mapping[str, GroupKey]) -> dict[GroupKey, int]:
    """``gang``'s GPUs per group of usable nodes (on a node gone or draining, they come back to no one)."""
    out: dict[GroupKey, int] = {}
    for node_id, gpus in gang.shards:
        key = groups.get(node_id)
        if key is not None:
            out[key] = out.get(key, 0) + len(gpus)
    return out


def turn(job_id: str) -> float:
    """A fixed offset in [0, 1) for ``job_id``'s draws."""
    return zlib.crc32(job_id.encode()) / 2**32


def draw(values: Sequence[float], u: float) -> float:
    """The value of ``values`` (ascending, not empty) at level ``u`` in [0, 1)."""
    return values[min(len(values) - 1, int(u * len(values)))]


def gang_ends(gang: RunningJob, now: datetime) -> tuple[float, ...]:
    """The seconds from ``now`` at which ``gang`` may end, ascending, to draw from (``NEVER`` alone: not known)."""
    elapsed = (now - gang.started_at).total_seconds()
    if gang.run_quantiles:
        ran_before = gang.attained_gpu_s / max(1, gang.gpu_count)
        later = tuple(e - elapsed for q in gang.run_quantiles if (e := max(1.0, q - ran_before)) > elapsed)
        return later or (max(elapsed, 1.0),)
    if gang.expected_end is None:
        return (NEVER,)
    left = (gang.expected_end - now).total_seconds()
    return (left if left > 0 else max(elapsed, 1.0),)


def gang_end(gang: RunningJob, now: datetime, u: float) -> float:
    """Seconds from ``now`` until ``gang`` ends, drawn at level ``u`` (``NEVER``: not known)."""
    return draw(gang_ends(gang, now), u)


def job_run(job: Queued, u: float) -> float:
    if job.run_quantiles:
        return max(1.0, draw(job.run_quantiles, u))
    return NEVER if job.run_s is None else max(job.run_s, 0.0)


def plan_intervals(
    free: Mapping[GroupKey, int],
    gangs: Iterable[tuple[RunningJob, Mapping[GroupKey, int]]],
    waiting: Sequence[Queued],
    *,
    now: datetime,
    policy: Policy,
) -> dict[str, Interval]:
    """The p50 and p90 start of each of ``waiting`` (in queue order). ``free``: GPUs free now per group, after this
    cycle's placements; ``gangs``: each gang holding GPUs (this cycle's placements too) with its GPUs per group."""
    held = list(gangs)
    possible = {gang.job_id: gang_ends(gang, now) for gang, _ in held}
    turns = {gang.job_id: turn(gang.job_id) for gang, _ in held} | {job.job_id: turn(job.job_id) for job in waiting}
    starts: dict[str, list[float]] = {job.job_id: [] for job in waiting}
    samples = max(1, policy.start_samples)
    for s in range(samples):
        level = (s + 0.5) / samples
        ends = {job_id: draw(found, (level + turns[job_id]) % 1.0) for job_id, found in possible.items()}
        releases = [(ends[g.job_id], key, count) for g, per_group in held for key, count in per_group.items()]
        runs = [Job(job.gpus, job.groups, job_run(job, (level + turns[job.job_id]) % 1.0)) for job in waiting]
        for job, at in zip(waiting, easy_starts(free, releases, runs), strict=True):
            starts[job.job_id].append(at)
    return {job_id: _interval(found, now) for job_id, found in starts.items()}


def _interval(starts: list[float], now: datetime) -> Interval:
    ordered = sorted(starts)

    def at(quantile: float) -> datetime | None:
        offset = ordered[max(0, math.ceil(quantile * len(ordered)) - 1)]
        return None if offset == NEVER else now + timedelta(seconds=offset)

    return Interval(at(0.5), at(0.9))
