"""Resizing a running elastic gang (``JobSpec.elasticity``) without a restart from its checkpoint. Pure: time comes in.

A resize is a re-formation the scheduler decides itself, by the path recovery takes (``reform.regroup``): the
attempt's shards stop, keeping their live state on their nodes, and the next attempt starts at once at the new size
on the kept shards' GPUs (and new ones when it grows), resuming from that state (the runner's ``peer_state``): no
step is lost. It is announced by ``JobResized`` with its typed reason; no retry is used.

- **Grow** (``grown``): a gang below its ``max_shards``, every shard of its attempt running for the cooldown, takes
  free GPUs for new shards when no waiting job could use them (``blocks_growth``). The new shards are placed alone,
  by the rules of any placement, never by preemption.
- **Shrink** (``shrunk``): when a cycle takes some of its surplus shards (``placement.surplus``) for a job that may
  preempt it, the gang gives up those shards and keeps the rest; its core up to ``min_shards`` is protected as a
  rigid gang is. The shards given up hold their GPUs until their processes end: until their node stops reporting
  them (``Leaving``), they stand in the snapshot as stopping for that job, as a preempted gang does, so that it waits
  for them instead of preempting anew.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from shardyard.events import JobResized, JobScheduled, JobSpec, NodeStatus, PendingReason, ResizeReason, ShardPlacement
from shardyard.events.job import Elasticity
from shardyard.gpus import canonical_model
from shardyard.placement.cycle import schedule
from shardyard.placement.model import NodeView, PendingJob, Place, RunningJob
from shardyard.placement.surplus import surplus_key
from shardyard.scheduler.gang import Gang
from shardyard.scheduler.orphans import ShardKey
from shardyard.scheduler.reform import Ground, regroup

NOT_FOR_THESE_GPUS = frozenset({PendingReason.NEVER_FITS})
"""Verdicts of a waiting job that no free GPU of this cluster would change: it does not hold a gang back from
growing."""


@dataclass(frozen=True)
class Leaving:
    """The shards a shrink gave up, while they stop."""

    spec: JobSpec
    by_job: str
    attempt: int
    """The attempt they were of."""
    shards: tuple[ShardPlacement, ...]
    since: datetime


def leaving(old: Gang, event: JobResized, placed: JobScheduled) -> Leaving | None:
    """What the shrink ``event`` of ``old`` gave up, now that its next attempt is ``placed``: the old attempt's
    training shards on GPUs the new one does not hold. None for a grow."""
    if event.by_job is None:
        return None
    held = {(p.node_id, p.gpu_indices) for p in placed.placements}
    gone = tuple(p for p in old.scheduled.placements if not p.spare and (p.node_id, p.gpu_indices) not in held)
    return Leaving(old.spec, event.by_job, event.attempt, gone, event.occurred_at) if gone else None


def stopping(
    left: Leaving, running: Mapping[str, frozenset[ShardKey]], now: datetime | None, bound_s: float
) -> list[RunningJob]:
    """``left``'s shards that their nodes still report running, as stopping for the job they made room for; none once
    ``bound_s`` has passed since the shrink at ``now`` (None: not judged), for a node that stopped reporting: its
    GPUs are then the pool's to judge."""
    if now is not None and (now - left.since).total_seconds() > bound_s:
        return []
    spec = left.spec
    return [
        RunningJob(
            job_id=surplus_key(spec.job_id, shard.shard_index),
            priority=spec.priority,
            preemptible=True,
            started_at=left.since,
            shards=((shard.node_id, shard.gpu_indices),),
            preempted_by=left.by_job,
            queue=spec.queue,
            live=True,
        )
        for shard in left.shards
        if (spec.job_id, shard.shard_index, left.attempt) in running.get(shard.node_id, frozenset())
    ]


@dataclass
class Shrinks:
    """The shards the book's shrinks gave up, from the shrink (``JobResized``) to their processes' end."""

    resized: dict[str, tuple[Gang, JobResized]] = field(default_factory=dict)
    """Job -> its gang before a shrink and the shrink, until its next attempt is placed."""
    leaving: dict[str, Leaving] = field(default_factory=dict)

    def shrunk(self, gang: Gang, event: JobResized) -> None:
        if event.by_job is not None:
            self.resized[event.job_id] = (gang, event)

    def placed(self, event: JobScheduled) -> None:
        before = self.resized.pop(event.job_id, None)
        left = None if before is None else leaving(*before, event)
        if left is not None:
            self.leaving[event.job_id] = left

    def forget(self, job_id: str) -> None:
        self.resized.pop(job_id, None)
        self.leaving.pop(job_id, None)

    def stopping(
        self, running: Mapping[str, frozenset[ShardKey]], now: datetime | None, bound_s: float
    ) -> list[RunningJob]:
        """Every shrink's shards still stopping (``stopping``); a shrink whose shards all stopped is forgotten."""
        out: list[RunningJob] = []
        for job_id, left in list(self.leaving.items()):
            still = stopping(left, running, now, bound_s)
            if not still:
                del self.leaving[job_id]
            out.extend(still)
        return out


def may_grow(gang: Gang, now: datetime, cooldown_s: float) -> bool:
    """Whether ``gang`` may grow now: elastic, below its maximum, not being preempted, every shard running for at
    least ``cooldown_s`` and none failed (a gang resized, recovered or placed just now first trains a while)."""
    elastic = gang.spec.elasticity
    if elastic is None or gang.size >= elastic.max_shards or gang.failed or gang.preempted_by is not None:
        return False
    if not gang.running or gang.restart_s is None:
        return False
    running_since = gang.scheduled.occurred_at + timedelta(seconds=gang.restart_s)
    return (now - running_since).total_seconds() >= cooldown_s


def blocks_growth(waiting: JobSpec, reason: PendingReason | None, grower: JobSpec) -> bool:
    """Whether a job still waiting after the cycle (``reason``: its verdict, None when it had none) could use GPUs
    that ``grower`` would take: unless it can never fit this cluster, or both name GPU models and they differ."""
    if reason in NOT_FOR_THESE_GPUS:
        return False
    return not (waiting.gpu_model and grower.gpu_model and waiting.gpu_model != grower.gpu_model)


def any_room(spec: JobSpec, views: Iterable[NodeView]) -> bool:
    """Whether some ALIVE node that is not draining has a free GPU of ``spec``'s model and TFLOPS: a pass over the
    views that spares a placement (``grown``) when nothing is free."""
    return any(
        view.free_gpus
        and view.status is NodeStatus.ALIVE
        and not view.draining
        and view.tflops >= spec.min_tflops
        and (spec.gpu_model is None or canonical_model(view.gpu_model) == spec.gpu_model)
        for view in views
    )


def grown(gang: Gang, excluded: frozenset[str], ground: Ground, now: datetime) -> Place | None:
    """``gang`` with as many new shards as fit now, up to its ``max_shards``, on GPUs free on ``ground.before``
    (off ``excluded``, by the job's filters, without preemption): the new shards follow its training shards, its
    spares stay spares. None when not one more fits."""
    elastic = gang.spec.elasticity
    if elastic is None or gang.size >= elastic.max_shards or not any_room(gang.spec, ground.views.values()):
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
