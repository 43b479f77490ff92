"""Resizing a running elastic gang (``JobSpec.elasticity``) without a restart from its checkpoint. Pure: time comes in.

A resize is a re-formation the scheduler decides itself, by the path recovery takes (``reform.regroup``): the
attempt's shards stop, keeping their live state on their nodes, and the next attempt starts at once at the new size
on the kept shards' GPUs (and new ones when it grows), resuming from that state (the runner's ``peer_state``): no
step is lost. It is announced by ``JobResized`` with its typed reason; no retry is used.

- **Grow** (``grown``): a running gang below its ``max_shards``, past the cooldown since its attempt started, takes
  free GPUs for new shards when no waiting job could use them (``blocks_growth``). The new shards are placed alone,
  by the rules of any placement, never by preemption.
- **Shrink** (``shrunk``): when a cycle takes some of its surplus shards (``placement.surplus``) for a job that may
  preempt it, the gang gives up those shards and keeps the rest; its core up to ``min_shards`` is protected as a
  rigid gang is.
"""

from dataclasses import replace
from datetime import datetime

from shardyard.events import JobResized, JobSpec, PendingReason, ResizeReason
from shardyard.events.job import Elasticity
from shardyard.placement.cycle import schedule
from shardyard.placement.model import PendingJob, Place
from shardyard.scheduler.gang import Gang
from shardyard.scheduler.reform import Ground, regroup

NOT_FOR_THESE_GPUS = frozenset({PendingReason.NEVER_FITS})
"""Verdicts of a waiting job that no free GPU of this cluster would change: it does not hold a gang back from
growing."""


def may_grow(gang: Gang, now: datetime, cooldown_s: float) -> bool:
    """Whether ``gang`` may grow now: elastic, below its maximum, every shard running and none failed, not being
    preempted, and its attempt at least ``cooldown_s`` old (a gang resized, recovered or placed just now waits)."""
    elastic = gang.spec.elasticity
    return (
        elastic is not None
        and gang.size < elastic.max_shards
        and gang.running
        and not gang.failed
        and gang.preempted_by is None
        and (now - gang.scheduled.occurred_at).total_seconds() >= cooldown_s
    )


def blocks_growth(waiting: JobSpec, reason: PendingReason | None, grower: JobSpec) -> bool:
    """Whether a job still waiting after the cycle (``reason``: its verdict, None when it had none) could use GPUs
    that ``grower`` would take: unless it can never fit this cluster, or both name GPU models and they differ."""
    if reason in NOT_FOR_THESE_GPUS:
        return False
    return not (waiting.gpu_model and grower.gpu_model and waiting.gpu_model != grower.gpu_model)


def grown(gang: Gang, excluded: frozenset[str], ground: Ground, now: datetime) -> Place | None:
    """``gang`` with as many new shards as fit now, up to its ``max_shards``, on GPUs free on ``ground.before``
    (off ``excluded``, by the job's filters, without preemption): the new shards follow its training shards, its
    spares stay spares. None when not one more fits."""
    elastic = gang.spec.elasticity
    if elastic is None or gang.size >= elastic.max_shards:
        return None
    extra, spec = elastic.max_shards - gang.size, gang.spec
    wanted = spec.model_copy(
        update={
            "shard_count": extra,
            "gpu_count": extra,
            "memory_bytes": spec.memory_per_shard * extra,
            "cpu_cores": spec.cpu_per_shard * extra,
            "elasticity": Elasticity(min_shards=1, max_shards=extra),
            "depends_on": (),
        }
    )
    alone = PendingJob(wanted, now, excluded_nodes=excluded)
    decisions = schedule(ground.before, [alone], replace(ground.policy, preemption=False), now=now)
    found = next((d for d in decisions if isinstance(d, Place) and d.job_id == spec.job_id), None)
    if found is None:
        return None
    training = [p for p in gang.scheduled.placements if not p.spare]
    spares = [p for p in gang.scheduled.placements if p.spare]
    return regroup(gang, [*training, *(p for p in found.placements if not p.spare)], spares, ground)


def shrunk(gang: Gang, dropped: set[int], ground: Ground) -> Place | None:
    """``gang`` without its training shards ``dropped`` (never below its ``min_shards``); None when nothing would
    be left to drop, or the rest cannot re-form (see ``regroup``)."""
    elastic = gang.spec.elasticity
    training = [p for p in gang.scheduled.placements if not p.spare]
    kept = [p for p in training if p.shard_index not in dropped]
    if elastic is None or len(kept) == len(training) or len(kept) < elastic.min_shards:
        return None
    return regroup(gang, kept, [p for p in gang.scheduled.placements if p.spare], ground)


def shrink_reason(gang: JobSpec, by_job: JobSpec | None) -> ResizeReason:
    """A shrink for a job of another queue at no higher priority is that queue's reclaim; else a preemption."""
    if by_job is not None and by_job.queue != gang.queue and by_job.priority <= gang.priority:
        return ResizeReason.SHRINK_FOR_RECLAIM
    return ResizeReason.SHRINK_FOR_PREEMPTION


def resized(gang: Gang, place: Place, reason: ResizeReason, by_job: str | None, now: datetime) -> JobResized:
    """The announcement of ``gang``'s re-formation as ``place``."""
    to_shards = sum(1 for p in place.placements if not p.spare)
    why = {
        ResizeReason.GROW_INTO_IDLE: "free GPUs no waiting job can use",
        ResizeReason.SHRINK_FOR_PREEMPTION: f"{by_job} needs its GPUs",
        ResizeReason.SHRINK_FOR_RECLAIM: f"{by_job}'s queue reclaims its quota",
    }[reason]
    return JobResized(
        occurred_at=now,
        job_id=gang.spec.job_id,
        attempt=gang.scheduled.attempt,
        from_shards=gang.size,
        to_shards=to_shards,
        reason=reason,
        by_job=by_job,
        message=f"{gang.size} -> {to_shards} shards: {why}",
    )
