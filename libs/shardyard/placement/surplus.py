"""An elastic gang's surplus: its training shards above ``min_shards``, offered to preemption one shard at a time.
Pure.

A running elastic gang is two kinds of preemptable job to a cycle: its core (its first ``min_shards`` training shards,
with its spares), protected as a rigid gang is, and each surplus shard alone, a ``RunningJob`` of its own under
``surplus_key``. Giving a surplus shard up re-forms the gang smaller from its live state (the scheduler's
``resize``): no step is lost, so a surplus shard costs only its restart (``RunningJob.live``), and the victim choice,
which takes the set of gangs that loses least, takes surplus before any whole gang. It is taken under the rules a
whole gang is (a higher priority, or a quota reclaim), and even when its job is not preemptible: an elastic job
consented to shrink to its minimum.
"""

from typing import Final

from shardyard.events import JobSpec, ShardPlacement

SURPLUS_MARK: Final = "+"
"""Between a job id and a shard index in a surplus shard's key: never in a job id (``JOB_ID_PATTERN``)."""


def surplus_key(job_id: str, shard_index: int) -> str:
    return f"{job_id}{SURPLUS_MARK}{shard_index}"


def surplus_of(key: str) -> tuple[str, int] | None:
    """The (job id, shard index) a surplus shard's key names; None for a whole gang's job id."""
    job_id, mark, index = key.rpartition(SURPLUS_MARK)
    if not mark or not job_id or not index.isdigit():
        return None
    return job_id, int(index)


def split(spec: JobSpec, placements: tuple[ShardPlacement, ...]) -> tuple[list[ShardPlacement], list[ShardPlacement]]:
    """(core, surplus) of a running gang's ``placements``: the surplus is its training shards from index
    ``min_shards`` on (an elastic job's), the core everything else, spares included. A rigid job has no surplus."""
    elastic = spec.elasticity
    if elastic is None:
        return list(placements), []
    core = [p for p in placements if p.spare or p.shard_index < elastic.min_shards]
    surplus = [p for p in placements if not p.spare and p.shard_index >= elastic.min_shards]
    return core, surplus
