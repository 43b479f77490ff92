"""Elastic jobs (``JobSpec.elasticity``): a job that does not fit at its preferred size starts at the largest size
from its ``min_shards`` up that fits now, rather than wait. Each shard keeps its memory and CPU (the spec's per
shard), so a smaller gang asks for less of each. Pure.

It is tried after the preferred size and its backfill failed, and before the job preempts or reserves: a gang that
can start now at its minimum stops nobody (preemption is for jobs that cannot start at all), and any later growth
is into GPUs nothing else waits for.
"""

from datetime import datetime

from shardyard.events import PendingReason
from shardyard.placement.candidate import Candidate
from shardyard.placement.contention import explain, tally
from shardyard.placement.gang_placement import Links, place_gang
from shardyard.placement.index import ClusterIndex
from shardyard.placement.model import Place, Unschedulable


def place_smaller(index: ClusterIndex, job: Candidate, links: Links) -> Place | None:
    """``job`` placed at the largest size below its preferred one and at least its ``min_shards`` that fits now;
    None for a rigid job, or when not even its minimum fits. The sizes tried start at what the nodes that pass its
    filters can take, so a failure costs a placement or two, not one per size."""
    elastic = job.spec.elasticity
    if elastic is None or not job.eligible:
        return None
    preferred = job.k
    room = sum(shards for _slot, shards in tally(index, job).passing)
    try:
        for size in range(min(preferred - 1, room), elastic.min_shards - 1, -1):
            job.k = size
            placed = place_gang(index, job, links)
            if placed is not None:
                return placed
        return None
    finally:
        job.k = preferred


def explain_sized(index: ClusterIndex, job: Candidate, now: datetime) -> tuple[Unschedulable, int]:
    """``contention.explain`` of ``job``. An elastic job that its preferred size could never fit (more GPUs than the
    cluster has of its kind) is judged at its minimum instead, and decided at it from then on: it preempts and
    reserves for its minimum."""
    verdict, passing = explain(index, job, now)
    elastic = job.spec.elasticity
    if elastic is None or verdict.reason is not PendingReason.NEVER_FITS or job.k <= elastic.min_shards:
        return verdict, passing
    job.k = elastic.min_shards
    return explain(index, job, now)
