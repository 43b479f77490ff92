"""The STRAGGLER alert and its Prometheus input: a running job's rank whose own time in a step (``compute_ms``, its
waits on the gang left out) is ``straggler_ratio`` times the median of the other ranks' or more, for
``straggler_for_s``. Each rank's newest report of the current attempt counts. The summary names the rank and its
node, and what the fault manager did about it when it said (``JobStraggling``: swapped, no better place, the hour's
limit, or no node to blame)."""

import statistics
from collections.abc import Iterator
from datetime import datetime

from shardyard.events import AlertRule, AlertSeverity
from shardyard.lifecycle import JobState
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


def straggler(view: ClusterView, _now: datetime, policy: AlertPolicy) -> Iterator[Condition]:
    for job in view.jobs.values():
        if job.state is not JobState.RUNNING:
            continue
        worst = max(rank_ratios(job), key=lambda r: r[2], default=None)
        if worst is None or worst[2] < policy.straggler_ratio:
            continue
        index, node, ratio = worst
        said = [s for s in job.stragglers if s["attempt"] == job.attempt and s["shard_index"] == index]
        then = f"; the fault manager: {said[-1]['kind']}, {said[-1]['action']}" if said else ""
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


def straggler_family(view: ClusterView) -> Family:
    ratio = Family(
        "shardyard_shard_compute_ratio",
        "A running job's rank: its own time in a step (its waits on the gang left out) over the median of the other "
        "ranks' (the STRAGGLER rule's input)",
        ["job", "shard", "node"],
    )
    for job in view.jobs.values():
        if job.state is JobState.RUNNING:
            for index, node, value in rank_ratios(job):
                ratio.add((job.job_id, str(index), node), value)
    return ratio
