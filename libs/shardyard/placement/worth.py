"""Whom a job preempts and what it holds meanwhile, by ``Policy.victims``. ``order``: the first gangs of the
victim order that make room (``victims.choose_victims``), holding their nodes. ``lost-work``: what the job weighs
beyond whom it may preempt (``candidate.outranks``, unchanged) and which set of them loses least
(``victims.make_room``), below. Pure.

- **Tiers.** Victims come from the lowest tier that makes room: the lowest priority, then the latest LAS queue (the
  victim order's first two keys); the set that loses least is chosen among the gangs of the tiers taken. A gang of
  a higher tier is not stopped while lower ones would do: it would only come back to preempt those in turn (a
  priority-500 gang stopped for a priority-900 job preempts a priority-0 gang as soon as it is pending again).
- **Worth.** A job of its victims' own priority (a LAS preemption: it is only ahead of them in the queue) preempts
  only when the wait it saves outweighs what its victims lose, in work and in time:
  - its GPUs x its expected wait without preempting (until enough GPUs it can use are expected to be free, from the
    running gangs' expected ends) must exceed the set's ``RunningJob.lost_gpu_s``;
  - and, where its run time is known or learned, that wait must exceed the delay its victims are expected to take
    (``victims_delay_s``): each waits about as long as the job runs, or as the job would have waited, whichever is
    shorter, and then restarts. A job's completion time counts once whatever its size, so stopping three gangs to
    save one job 10 minutes, when it runs for an hour, lengthens the average job's life: with checkpoints on notice
    every preemption loses about as little work, and the victims' delay is what is left to weigh.
  Preemption for a higher priority is never weighed.
- **Room.** While its victims stop, the job holds their nodes and, of the nodes it can use now, those whose free
  GPUs it counted on, so that no job of lower rank takes them meanwhile and one preemption is enough (else it finds
  no room at the victims' release and preempts again, often the gang that just took its place).
"""

import math
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from datetime import datetime

from shardyard.placement.candidate import Candidate, running_queue
from shardyard.placement.contention import tally
from shardyard.placement.index import ClusterIndex
from shardyard.placement.model import RunningJob
from shardyard.placement.quota import QuotaCycle, queue_models
from shardyard.placement.victims import VictimEntry, choose_victims, hold_for, make_room, outranked

EndOf = Callable[[RunningJob, datetime], datetime]
"""When a running gang with an expected end is expected to end, seen at a time (``overrun_end``)."""


def choose(
    index: ClusterIndex,
    job: Candidate,
    order: Sequence[VictimEntry],
    running: Sequence[RunningJob],
    passing: int,
    now: datetime,
    end_of: EndOf,
) -> list[RunningJob]:
    """The gangs ``job`` preempts, of the ``running`` ones in victim ``order``, to fit with the ``passing`` GPUs;
    empty when it should not (or cannot) preempt."""
    if index.policy.victims == "order":
        return choose_victims(index, job, order, passing, now)
    chosen = by_tiers(index, job, list(outranked(job, order, index.policy, now)), passing, now)
    return chosen if chosen and worth_it(index, job, chosen, running, passing, now, end_of) else []


def choose_in(
    quota: QuotaCycle | None,
    index: ClusterIndex,
    job: Candidate,
    order: Sequence[VictimEntry],
    running: Sequence[RunningJob],
    passing: int,
    now: datetime,
    stopping: Collection[str],
) -> list[RunningJob]:
    """The gangs to preempt for ``job`` (``choose``), never one of ``stopping`` (preempted earlier in this cycle for
    another job); with queues, the borrowers its queue may reclaim from first (the set of them that loses least,
    when they make room: never weighed), and priority preemption only within its queue, weighed as without queues
    (``placement.quota``)."""
    if stopping:
        order = [entry for entry in order if entry[3] not in stopping]
    if quota is None:
        return choose(index, job, order, running, passing, now, overrun_end)
    policy, models = index.policy, queue_models(job.eligible)

    def free(gangs: Iterable[RunningJob]) -> Iterator[RunningJob]:
        return (gang for gang in gangs if gang.job_id not in stopping)

    if policy.victims == "order":
        victims = quota.victims(job.pending, models, lambda: outranked(job, order, policy, now), now)
        return make_room(index, job, free(victims), passing, now)
    reclaim = quota.victims(job.pending, models, lambda: iter(()), now)
    borrowers = make_room(index, job, free(reclaim), passing, now)
    if borrowers:
        return borrowers
    weighed = list(free(quota.victims(job.pending, models, lambda: outranked(job, order, policy, now), now)))
    chosen = by_tiers(index, job, weighed, passing, now)
    return chosen if chosen and worth_it(index, job, chosen, running, passing, now, overrun_end) else []


def overrun_end(gang: RunningJob, now: datetime) -> datetime:
    """When ``gang`` is expected to end: its expected end, or, once past it, as long again from now as it has run
    in this attempt (run times are heavy-tailed: the longer a job has run, the longer it is likely to run on)."""
    assert gang.expected_end is not None
    if gang.expected_end > now:
        return gang.expected_end
    return now + (now - gang.started_at)


def by_tiers(
    index: ClusterIndex, job: Candidate, outranked: Sequence[RunningJob], passing: int, now: datetime
) -> list[RunningJob]:
    """The set of ``outranked`` (in victim order) that makes room for ``job`` at the least loss within the fewest
    tiers (see the module's doc); empty when all of them would not."""
    policy = index.policy
    tiers = [(gang.priority, -running_queue(gang, policy, now)) for gang in outranked]
    for end in range(1, len(outranked) + 1):
        if end < len(outranked) and tiers[end] == tiers[end - 1]:
            continue  # the tier goes on
        chosen = make_room(index, job, outranked[:end], passing, now)
        if chosen:
            return chosen
    return []


def worth_it(
    index: ClusterIndex,
    job: Candidate,
    chosen: Sequence[RunningJob],
    running: Sequence[RunningJob],
    passing: int,
    now: datetime,
    end_of: EndOf,
) -> bool:
    """Whether ``job`` should stop ``chosen``: always for a higher priority than all of them; else when its GPUs x
    its expected wait (``expected_wait_s``) exceed what they lose, and that wait their delay (``victims_delay_s``)."""
    if all(gang.priority < job.spec.priority for gang in chosen):
        return True
    restart_s = index.policy.restart_s
    lost = sum(gang.lost_gpu_s(now, restart_s) for gang in chosen)
    wait = expected_wait_s(index, job, running, passing, now, end_of)
    if job.k * wait <= lost:
        return False
    delay = victims_delay_s(job, chosen, wait, restart_s)
    return delay is None or wait > delay


def victims_delay_s(job: Candidate, chosen: Sequence[RunningJob], wait_s: float, restart_s: float) -> float | None:
    """Seconds of delay ``chosen``'s jobs are expected to take, all together, if ``job`` (expected to wait
    ``wait_s`` otherwise) stopped them: each its restart plus the expected shorter of the job's run and that wait
    (over the job's run-time spread beyond what it already ran, else its expected run); None: the job's run time is
    neither known nor learned."""
    pending = job.pending
    done_s = pending.attained_gpu_s / max(1, job.k)
    left = [run_s - done_s for run_s in pending.run_quantiles if run_s > done_s]
    if left:
        held_s = sum(min(run_s, wait_s) for run_s in left) / len(left)
    elif pending.expected_run_s is not None:
        held_s = min(pending.expected_run_s, wait_s)
    else:
        return None
    return sum(held_s + (restart_s if gang.restart_s is None else gang.restart_s) for gang in chosen)


def expected_wait_s(
    index: ClusterIndex, job: Candidate, running: Sequence[RunningJob], passing: int, now: datetime, end_of: EndOf
) -> float:
    """Seconds until ``job``'s GPUs are expected to be free without preempting: the ``passing`` ones now, then
    those of the running gangs on nodes of the groups it may use, as each is expected to end (a gang stopping, now;
    one with no expected end, never: so is the wait when the others' GPUs are too few). It counts GPUs, not the
    gangs' shapes: a lower bound where nodes fragment."""
    need = job.k - passing
    if need <= 0:
        return 0.0
    ends: list[tuple[float, int]] = []
    for gang in running:
        gpus = sum(len(gpus) for node_id, gpus in gang.shards if _usable_by(index, node_id, job))
        if not gpus:
            continue
        if gang.preempted_by is not None:
            ends.append((0.0, gpus))
        elif gang.expected_end is not None:
            ends.append((max(0.0, (end_of(gang, now) - now).total_seconds()), gpus))
    ends.sort()
    for wait_s, gpus in ends:
        need -= gpus
        if need <= 0:
            return wait_s
    return math.inf


def _usable_by(index: ClusterIndex, node_id: str, job: Candidate) -> bool:
    slot = index.slots.get(node_id)
    return slot is not None and (slot.group.model, slot.group.tflops) in job.eligible


def hold_room(index: ClusterIndex, job: Candidate, victims: Sequence[RunningJob]) -> None:
    """Hold ``victims``' nodes for ``job`` and, by lost work, most free first, the nodes it can use now that give
    it the GPUs they lack (see the module's doc)."""
    job_id = job.spec.job_id
    hold_for(index, victims, job_id)
    if index.policy.victims == "order":
        return
    freed = sum(len(gpus) for gang in victims for node_id, gpus in gang.shards if _usable_by(index, node_id, job))
    need = job.k - freed
    for slot, shards in sorted(tally(index, job).passing, key=lambda passing: (-passing[1], passing[0].order)):
        if need <= 0:
            return
        index.reserve(slot, job_id)
        need -= shards
