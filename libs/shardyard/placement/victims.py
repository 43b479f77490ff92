"""Whom to preempt for a job that does not fit: the gangs it may stop (outranks), and among them the set that
loses least. Pure.

``Policy.victims`` says how the set is chosen:

- ``lost-work`` (the default): the set of outranked gangs whose GPUs make room for the job at the least lost work
  (``RunningJob.lost_gpu_s``: each GPU's time since the gang's last durable checkpoint, plus its restart cost), a
  branch and bound over the candidates in order of their own loss; ties go to the lower priority, then the newest
  gang. Who may be preempted at all (priority, the LAS queues and ``min_runtime_s``, quotas) is unchanged.
- ``order``: the first gangs of the victim order that make room, as before lost work was counted.
"""

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from shardyard.events import PendingReason
from shardyard.placement.candidate import Candidate, pending_queue
from shardyard.placement.filters import could_host, shards
from shardyard.placement.index import ClusterIndex, Slot
from shardyard.placement.model import Policy, RunningJob, Unschedulable, epoch_us

SEARCH_STEPS = 2_000
"""Sets the branch and bound looks at for one job before it keeps the best found (the greedy set at worst): a
cycle's cost stays bounded however many gangs a job outranks."""
EPSILON_GPU_S = 1e-6
"""Losses closer than this are equal (the tie rules decide)."""

VictimEntry = tuple[int, int, int, str, RunningJob, bool]
"""(priority, -LAS queue, -start (microseconds), job id, the gang, whether it ran its minimum time in this
attempt)."""


def victim_order(running: Sequence[RunningJob], policy: Policy, now: datetime) -> list[VictimEntry]:
    """The gangs that may be preempted, in the order victims are taken: lowest priority, then most service attained
    (latest LAS queue), then most recently started. Worked out once per cycle, for every job's ``choose_victims``."""
    now_us = epoch_us(now)
    thresholds, min_runtime_s = policy.las_thresholds_gpu_s, policy.min_runtime_s
    entries: list[VictimEntry] = [
        (
            gang.priority,
            # ``candidate.running_queue``, inline: this runs for every gang in most cycles of a busy cluster.
            -bisect_right(
                thresholds, gang.attained_gpu_s + gang.gpu_count * max(0.0, (now_us - gang.started_us) / 1e6)
            ),
            -gang.started_us,
            gang.job_id,
            gang,
            (now_us - gang.started_us) / 1e6 >= min_runtime_s,
        )
        for gang in running
        if gang.preemptible and gang.preempted_by is None
    ]
    entries.sort(key=lambda entry: entry[:4])
    return entries


def choose_victims(
    index: ClusterIndex, job: Candidate, order: Sequence[VictimEntry], passing: int, now: datetime
) -> list[RunningJob]:
    """The preemptible gangs ``job`` outranks (``candidate.outranks``: a lower priority, or under LAS a later queue
    once they ran ``min_runtime_s``) whose GPUs make room for it, chosen by ``Policy.victims`` (``make_room``);
    empty when even all of them would not.

    The order makes the walk stop at the first gang ``job`` cannot outrank for good: one of a higher priority, or of
    its own priority in a LAS queue no later than its own (the rest of its priority come in earlier queues still)."""
    return make_room(index, job, outranked(job, order, index.policy, now), passing, now)


def outranked(job: Candidate, order: Sequence[VictimEntry], policy: Policy, now: datetime) -> Iterator[RunningJob]:
    priority = job.spec.priority
    las = policy.order == "las"
    queue = pending_queue(job.pending, policy, now) if las else 0
    for gang_priority, neg_queue, _start, _job_id, gang, ran_enough in order:
        if gang_priority > priority:
            return
        if gang_priority == priority:
            if not las or -neg_queue <= queue:
                return
            if not ran_enough:
                continue
        yield gang


def enough(index: ClusterIndex, job: Candidate, victims: Iterable[RunningJob], passing: int) -> list[RunningJob]:
    """The first of ``victims`` whose GPUs, with the ``passing`` ones, fit ``job``; empty when all of them do not."""
    freed: dict[str, list[float]] = {}  # node -> [gpus, memory, cpu]
    chosen: list[RunningJob] = []
    total = passing
    for victim in victims:
        gain = 0
        for node_id, gpus in victim.shards:
            slot = index.slots.get(node_id)
            if slot is None or not _could_host(index, slot, job):
                continue
            before = _capacity_with(slot, job, freed.get(node_id))
            extra = freed.setdefault(node_id, [0.0, 0.0, 0.0])
            extra[0] += len(gpus)
            extra[1] += victim.memory_per_shard
            extra[2] += victim.cpu_per_shard
            gain += _capacity_with(slot, job, extra) - before
        if gain <= 0:
            continue
        chosen.append(victim)
        total += gain
        if total >= job.k:
            return chosen
    return []


def _could_host(index: ClusterIndex, slot: Slot, job: Candidate) -> bool:
    """Whether preempting gangs on ``slot`` could make room there for ``job``: it passes the state filters (it is in
    a bucket), the group filters, and the node filters that freed GPUs, memory and CPU do not cure."""
    return (slot.group.model, slot.group.tflops) in job.eligible and index.usable(slot) and could_host(slot, job)


def _capacity_with(slot: Slot, job: Candidate, extra: list[float] | None) -> int:
    gpus, memory, cpu = extra or (0.0, 0.0, 0.0)
    return shards(len(slot.free) + int(gpus), slot.memory + memory, slot.cpu + cpu, job)


def hold_for(index: ClusterIndex, victims: Sequence[RunningJob], job_id: str) -> None:
    """Hold ``victims``' nodes for ``job_id`` in this cycle, and claim them for it in the next (``claims``)."""
    nodes = frozenset(node_id for victim in victims for node_id, _gpus in victim.shards)
    index.claiming[job_id] = (frozenset(victim.job_id for victim in victims), nodes)
    for victim in victims:
        for node_id, _gpus in victim.shards:
            slot = index.slots.get(node_id)
            if slot is not None:
                index.reserve(slot, job_id)


def preempting_verdict(verdict: Unschedulable, victims: Sequence[RunningJob]) -> Unschedulable:
    names = ", ".join(sorted(v.job_id for v in victims))
    return replace(
        verdict,
        reason=PendingReason.PREEMPTING,
        message=f"preempting {names} (checkpoint, then requeue) to make room; {verdict.message}",
        missing=(),
    )


def make_room(
    index: ClusterIndex, job: Candidate, victims: Iterable[RunningJob], passing: int, now: datetime
) -> list[RunningJob]:
    """Of ``victims`` (gangs ``job`` may preempt, in victim order), those to stop so that, with the ``passing``
    GPUs, it fits: by ``Policy.victims``; empty when even all of them would not do."""
    if index.policy.victims == "order":
        return enough(index, job, victims, passing)
    return least_lost(index, job, victims, passing, now)


@dataclass(frozen=True)
class Option:
    """A gang that may be preempted, as the search weighs it."""

    gang: RunningJob
    lost: float
    """GPU-seconds lost were it stopped now (``RunningJob.lost_gpu_s``)."""
    most: int
    """The most shards of the job stopping it could make room for: its GPUs on nodes that could host the job, with
    those nodes' free ones (never below what it gives, so the search may prune on it)."""


def options(index: ClusterIndex, job: Candidate, victims: Iterable[RunningJob], now: datetime) -> list[Option]:
    """The gangs of ``victims`` that could make room for ``job``, least loss first; among equal losses the lower
    priority, then the newest gang."""
    restart_s = index.policy.restart_s
    found = []
    for gang in victims:
        most = 0
        for node_id in dict.fromkeys(node_id for node_id, _gpus in gang.shards):
            slot = index.slots.get(node_id)
            if slot is not None and _could_host(index, slot, job):
                most += len(slot.free) + sum(len(gpus) for n, gpus in gang.shards if n == node_id)
        if most > 0:
            found.append(Option(gang, gang.lost_gpu_s(now, restart_s), most))
    found.sort(key=lambda o: (o.lost, o.gang.priority, -o.gang.started_us, o.gang.job_id))
    return found


def gain(index: ClusterIndex, job: Candidate, gangs: Iterable[RunningJob]) -> int:
    """Shards of ``job`` the nodes could take once ``gangs`` all stopped, beyond those they take now."""
    freed: dict[str, list[float]] = {}
    for gang in gangs:
        _free(index, job, gang, freed)
    return sum(
        _capacity_with(index.slots[node_id], job, extra) - _capacity_with(index.slots[node_id], job, None)
        for node_id, extra in freed.items()
    )


def _free(index: ClusterIndex, job: Candidate, gang: RunningJob, freed: dict[str, list[float]]) -> None:
    for node_id, gpus in gang.shards:
        slot = index.slots.get(node_id)
        if slot is not None and _could_host(index, slot, job):
            extra = freed.setdefault(node_id, [0.0, 0.0, 0.0])
            extra[0] += len(gpus)
            extra[1] += gang.memory_per_shard
            extra[2] += gang.cpu_per_shard


def least_lost(
    index: ClusterIndex, job: Candidate, victims: Iterable[RunningJob], passing: int, now: datetime
) -> list[RunningJob]:
    """The set of ``victims`` that makes room for ``job`` at the least lost work (see the module's doc); empty when
    even all of them would not."""
    found = options(index, job, victims, now)
    need = job.k - passing
    if need <= 0 or sum(o.most for o in found) < need:
        return []
    return _Search(index, job, found, need).run()


class _Search:
    """Branch and bound over ``found`` (least loss first): a set is kept when it loses less than the best so far,
    or as little and its members come earlier in that order (the tie rules). Seeded with the greedy set."""

    def __init__(self, index: ClusterIndex, job: Candidate, found: list[Option], need: int) -> None:
        self.index, self.job, self.found, self.need = index, job, found, need
        self.most_after = [0] * (len(found) + 1)
        for i in range(len(found) - 1, -1, -1):
            self.most_after[i] = self.most_after[i + 1] + found[i].most
        self.best: tuple[float, tuple[int, ...]] | None = None
        self.steps = 0

    def run(self) -> list[RunningJob]:
        self._greedy()
        if self.best is None:
            return []
        self._walk(0, (), 0.0, 0)
        return [self.found[i].gang for i in self.best[1]]

    def _greedy(self) -> None:
        """Take gangs least loss first until there is room, then drop those the rest make redundant (most loss
        first): a set to beat, and the answer when the search runs out of steps."""
        taken: list[int] = []
        for i in range(len(self.found)):
            taken.append(i)
            if self._gain(taken) >= self.need:
                break
        else:
            return
        for i in sorted(taken, key=lambda i: -self.found[i].lost):
            rest = [j for j in taken if j != i]
            if self._gain(rest) >= self.need:
                taken = rest
        self._offer(tuple(sorted(taken)))

    def _walk(self, start: int, chosen: tuple[int, ...], lost: float, gained: int) -> None:
        """Every set that adds gangs from ``start`` on to ``chosen`` (which loses ``lost`` and gives ``gained``)."""
        for i in range(start, len(self.found)):
            self.steps += 1
            assert self.best is not None
            total = lost + self.found[i].lost
            if self.steps > SEARCH_STEPS or gained + self.most_after[i] < self.need:
                return  # out of steps, or even all the gangs left would not make room
            if total > self.best[0] + EPSILON_GPU_S:
                return  # every later gang loses at least as much
            with_it = (*chosen, i)
            more = self._gain(with_it)
            if more >= self.need:
                self._offer(with_it)
            elif more > gained:
                self._walk(i + 1, with_it, total, more)

    def _offer(self, chosen: tuple[int, ...]) -> None:
        lost = sum(self.found[i].lost for i in chosen)
        best = self.best
        if best is None or lost < best[0] - EPSILON_GPU_S or (lost <= best[0] + EPSILON_GPU_S and chosen < best[1]):
            self.best = (lost, chosen)

    def _gain(self, chosen: Iterable[int]) -> int:
        return gain(self.index, self.job, (self.found[i].gang for i in chosen))
