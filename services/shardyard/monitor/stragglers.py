"""The STRAGGLER alert and its Prometheus input, per running job, on two grounds:

- **its ranks' own times**: a rank whose own time in a step (``compute_ms``, its waits on the gang left out) is
  ``straggler_ratio`` times the median of the other ranks' or more, for ``straggler_for_s``. Each rank's newest
  report of the current attempt counts.
- **the fault manager's verdict** (``JobStraggling`` on a rank: a slow node or an imbalanced job, judged over its
  window of reports): at once, for ``straggler_said_s``. A straggler the fault manager swaps out is gone in seconds,
  before its own times have held for ``straggler_for_s``: the verdict is what shows it.

The summary names the rank and its node, and what the fault manager did about it when it said (swapped, no better
place, the hour's limit, or no node to blame). A slow link has its own alert (``SLOW_LINK``)."""

import statistics
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from shardyard.events import AlertRule, AlertSeverity
from shardyard.lifecycle import TERMINAL, JobState
from shardyard.monitor.condition import Condition
from shardyard.monitor.exposition import Family
from shardyard.monitor.jobs import JobView
from shardyard.monitor.policy import AlertPolicy
from shardyard.monitor.views import ClusterView


def rank_ratios(job: JobView) -> list[tuple[int, str, float]]:
    """(rank, node, its own time over the median of the others') for each rank of the current attempt that reported
    one; empty for a gang of one or before two ranks reported."""
    own = {
        index: (str(shard["node_id"]), float(shard["compute_ms"]))
        for index, shard in job.shards.items()
        if shard.get("attempt") == job.attempt and float(shard.get("compute_ms") or 0.0) > 0
    }
    out = []
    for index, (node, ms) in sorted(own.items()):
        others = [other for i, (_node, other) in own.items() if i != index]
        if others:
            out.append((index, node, ms / statistics.median(others)))
    return out


def said_of(job: JobView, now: datetime, policy: AlertPolicy) -> dict[str, Any] | None:
    """The fault manager's newest verdict on a rank of ``job`` within ``straggler_said_s``, if any."""
    recent = [
        said
        for said in job.stragglers
        if said.get("shard_index") is not None
        and (now - datetime.fromisoformat(said["occurred_at"])).total_seconds() <= policy.straggler_said_s
    ]
    return max(recent, key=lambda said: str(said["occurred_at"]), default=None)


def straggler(view: ClusterView, now: datetime, policy: AlertPolicy) -> Iterator[Condition]:
    for job in view.jobs.values():
        if job.state in TERMINAL:
            continue
        said = said_of(job, now, policy)
        if said is not None:
            yield Condition(
                AlertRule.STRAGGLER,
                job.job_id,
                AlertSeverity.WARNING,
                f"{job.job_id}: rank {said['shard_index']} on {said['node_id']} took {said['ratio']:.1f}x the gang's"
                f" own time a step; the fault manager: {said['kind']}, {said['action']}",
                float(said["ratio"]),
                policy.straggler_ratio,
                datetime.fromisoformat(said["occurred_at"]),
            )
            continue
        worst = max(rank_ratios(job), key=lambda r: r[2], default=None) if job.state is JobState.RUNNING else None
        if worst is None or worst[2] < policy.straggler_ratio:
            continue
        index, node, ratio = worst
        said_before = [s for s in job.stragglers if s["attempt"] == job.attempt and s["shard_index"] == index]
        then = f"; the fault manager: {said_before[-1]['kind']}, {said_before[-1]['action']}" if said_before else ""
        yield Condition(
            AlertRule.STRAGGLER,
            job.job_id,
            AlertSeverity.WARNING,
            f"{job.job_id}: rank {index} on {node} takes {ratio:.1f}x the gang's own time a step{then}",
            ratio,
            policy.straggler_ratio,
            None,
            for_s=policy.straggler_for_s,
        )


def straggler_families(view: ClusterView) -> list[Family]:
    ratio = Family(
        "shardyard_shard_compute_ratio",
        "A running job's rank: its own time in a step (its waits on the gang left out) over the median of the other "
        "ranks' (the STRAGGLER rule's input)",
        ["job", "shard", "node"],
    )
    said = Family(
        "shardyard_job_straggler_said_timestamp_seconds",
        "A job not ended: when the fault manager last judged one of its ranks a straggler (the STRAGGLER rule's other "
        "input)",
        ["job"],
    )
    for job in view.jobs.values():
        if job.state is JobState.RUNNING:
            for index, node, value in rank_ratios(job):
                ratio.add((job.job_id, str(index), node), value)
        times = [datetime.fromisoformat(s["occurred_at"]) for s in job.stragglers if s.get("shard_index") is not None]
        if times and job.state not in TERMINAL:
            said.add((job.job_id,), max(times).timestamp())
    return [ratio, said]
