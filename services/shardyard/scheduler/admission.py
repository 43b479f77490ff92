"""Admitting a placed gang: how many spares it gets, the rendezvous port its coordinator serves, and the events that
carry the placement out (the job's ``JobScheduled``, then one ``ShardAssignment`` per shard, spares included).
Pure: time comes in; the book picks the attempt number (see ``fencing``) and applies the placement it publishes.
"""

import math
from collections.abc import Collection, Iterable
from datetime import datetime

from shardyard.events import JobScheduled, JobSpec, ShardAssignment, Workload
from shardyard.placement.model import NodeView, PendingJob, Place
from shardyard.scheduler.gang import Gang

MAX_SHARDS = 1 << 20
"""Beyond any shard count admission accepts (4096): a larger one gets no spares (its job fails in the cycle)."""


def spares(spec: JobSpec, ratio: float) -> int:
    """The spares a gang of ``spec`` gets under the fault manager's redundancy ``ratio``: ceil(shards x ratio)."""
    if ratio <= 0 or not 0 < spec.shard_count <= MAX_SHARDS:
        return 0  # a shard count no admission accepts fails the job in the cycle, not here
    # The epsilon keeps a product that is whole but for float rounding (25 x 0.28) from taking one spare more.
    return math.ceil(spec.shard_count * ratio - 1e-9)


def waits_for_spares(place: Place, job: PendingJob, *, wanted: int, first: bool, grace_s: float, now: datetime) -> bool:
    """Whether the job's ``first`` placement, short of the ``wanted`` spares, waits for them: up to ``grace_s`` after
    the job became ready (agents report a new job's artifacts within a fraction of a second, one after another).
    Then the gang goes without; a later attempt never waits."""
    placed = sum(1 for p in place.placements if p.spare)
    if placed >= wanted or not first:
        return False
    return (now - job.ready_at).total_seconds() < grace_s


def ports_in_use(gangs: Iterable[Gang]) -> dict[str, set[int]]:
    """Node -> the rendezvous ports its gangs' coordinators hold there."""
    used: dict[str, set[int]] = {}
    for gang in gangs:
        used.setdefault(gang.scheduled.coordinator_node, set()).add(gang.scheduled.rendezvous_port)
    return used


def free_port(view: NodeView, gangs: Iterable[Gang], last: tuple[str, int] | None) -> int | None:
    """A rendezvous port of ``view`` that no gang uses, and not ``last``, the (node, port) of the job's previous
    rendezvous: the old attempt's store may linger on it."""
    return first_free(view, ports_in_use(gangs).get(view.node_id, set()), last)


def first_free(view: NodeView, used: Collection[int], last: tuple[str, int] | None) -> int | None:
    """``free_port`` with the ports ``view``'s gangs hold known (``ports_in_use``)."""
    avoid = last[1] if last is not None and last[0] == view.node_id else None
    return next((p for p in view.rendezvous_ports if p not in used and p != avoid), None)


def workload(spec: JobSpec, *, output_path: str, resume_from: str | None) -> Workload:
    """What every shard of the attempt runs: the job's inputs as it wrote them, and where it checkpoints."""
    return Workload(
        model_path=spec.model_path,
        dataset_path=spec.dataset_path,
        output_path=output_path,
        sync_interval=spec.sync_interval,
        **spec.training.model_dump(),
        resume_from=resume_from,
        entrypoint=spec.entrypoint,
        global_batch=spec.shard_count * spec.training.batch_size,
    )


def admit(
    place: Place,
    spec: JobSpec,
    coordinator: NodeView,
    *,
    attempt: int,
    term: int,
    port: int,
    output_path: str,
    resume_from: str | None,
    now: datetime,
    notice_s: float | None = None,
) -> tuple[JobScheduled, list[ShardAssignment]]:
    """The placement ``place`` of ``spec`` as attempt ``attempt`` under ``term``, its rendezvous on ``coordinator``
    at ``port``, resuming from ``resume_from`` (None: from the start); a preemption notice gives its shards
    ``notice_s`` to checkpoint and stop (None: the agent's default)."""
    scheduled = JobScheduled(
        occurred_at=now,
        job_id=place.job_id,
        attempt=attempt,
        term=term,
        coordinator_node=place.coordinator_node,
        rendezvous_port=port,
        placements=place.placements,
        degraded=place.degraded,
        resume_from=resume_from,
        coordinator_source=place.coordinator_source,
    )
    runs = workload(spec, output_path=output_path, resume_from=resume_from)
    world_size = sum(1 for shard in place.placements if not shard.spare)  # an elastic job's may be below its spec's
    assignments = [
        ShardAssignment(
            occurred_at=now,
            job_id=spec.job_id,
            shard_index=shard.shard_index,
            world_size=world_size,
            node_id=shard.node_id,
            gpu_indices=shard.gpu_indices,
            attempt=attempt,
            term=term,
            master_addr=coordinator.address,
            master_port=port,
            workload=runs,
            spare=shard.spare,
            notice_s=notice_s,
        )
        for shard in place.placements
    ]
    return scheduled, assignments
