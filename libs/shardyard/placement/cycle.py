"""Gang placement as a pure function: ``schedule(snapshot, pending, policy, now) -> decisions``.

One cycle, in phases:
1. **index** the frozen snapshot (nodes grouped by GPU model and TFLOPS, bucketed by load step and free GPUs);
2. **order** the pending jobs (``Policy.order``): by priority, then least attained service (``las``, the default)
   or aging (``aging``), then by how long they have been ready;
3. **place** each job whole or not at all: filter (alive, not draining, GPU model and TFLOPS — or the job's degraded
   floor once its ``max_wait_s`` has passed — load, free GPUs, memory, CPU, artifacts), rank (best match, least
   load, artifact locality, fragmentation, mutual latency), and make the member with the lowest mean RTT to the
   others the coordinator; an elastic job that does not fit at its preferred size starts smaller (``elastic``);
4. a job that does not fit **preempts** gangs it outranks when that would make room (its victims' nodes then
   ``claims``), else it **reserves** the nodes it will need from the time their gangs are expected to end, and is
   **unschedulable** with a typed reason, per-filter node counts and that time. Later jobs backfill elsewhere, or
   onto reserved nodes when expected to end before the reservation starts (EASY backfill).

A job whose data breaks a phase (ordering or deciding raises on it) is decided :class:`Invalid` and left out: one
bad job never stops placement.

No I/O, no clock: ``now`` comes in.
"""

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from shardyard.events import PendingReason
from shardyard.placement import claims
from shardyard.placement.candidate import RESERVABLE, Candidate, QueueKey, queue_key
from shardyard.placement.contention import explain, reserve_for
from shardyard.placement.elastic import explain_sized, place_smaller
from shardyard.placement.gang_placement import Links, place_gang
from shardyard.placement.index import ClusterIndex, Slot
from shardyard.placement.intervals import Queued, free_now, per_group, plan_intervals
from shardyard.placement.model import (
    Decision,
    Invalid,
    NodeView,
    PendingJob,
    Place,
    Policy,
    Preempt,
    RunningJob,
    Snapshot,
    Unschedulable,
)
from shardyard.placement.quota import QuotaCycle
from shardyard.placement.standing import StandingIndex
from shardyard.placement.victims import (
    VictimEntry,
    gain,
    hold_for,
    make_room,
    outranked,
    preempting_verdict,
    victim_order,
)
from shardyard.placement.worth import choose_in, hold_room, overrun_end

CLAIMING = RESERVABLE | {PendingReason.PREEMPTING}
"""A job that waits for one of these within its queue's nominal quota claims it (``placement.quota``)."""


class PlacementCycle:
    """One scheduling cycle over a snapshot: ``decide`` each pending job in queue order (``schedule`` does).

    Building the cycle indexes the snapshot once; each ``decide`` then costs about the same at any cluster size.
    """

    def __init__(
        self, snapshot: Snapshot, policy: Policy | None = None, *, now: datetime, index: StandingIndex | None = None
    ) -> None:
        self.policy = policy or Policy()
        self.now = now
        self.running = snapshot.running
        measured = bool(snapshot.rtt_ms)
        if index is not None:  # kept across cycles, and holding ``snapshot``'s nodes: no per-node work here
            assert index.policy == self.policy, "the standing index was built for another policy"
            self.index: ClusterIndex = index
            topology = measured or index.with_topology > 0
        else:
            self.index = ClusterIndex(snapshot.nodes, self.policy)
            topology = measured or any(view.zone or view.rack for view in snapshot.nodes)
        self.links = Links(snapshot.rtt_ms, snapshot.mean_rtt_ms, snapshot.slow_nodes, topology, snapshot.degraded)
        self.waiting_on: dict[str, list[RunningJob]] = {}
        for gang in snapshot.running:
            if gang.preempted_by is not None:
                self.waiting_on.setdefault(gang.preempted_by, []).append(gang)
        self._gangs_on: Mapping[str, Sequence[RunningJob]] | None = snapshot.gangs_on
        self._placed_on: dict[str, list[RunningJob]] = {}
        """Node id -> the gangs placed there this cycle."""
        self._no_backfill: dict[tuple[object, ...], float] = {}
        """Job shape -> the shortest expected run of that shape that failed to backfill since the last reservation."""
        self.unplaceable: dict[tuple[object, ...], Unschedulable] = {}
        self._victims: list[VictimEntry] | None = None
        """The gangs preemption may stop, in victim order (``contention.victim_order``), once a job needs them."""
        self._stopping: set[str] = set()  # the gangs this cycle preempts
        self.reservations = self.policy.reservations
        self.held: list[tuple[datetime, list[Slot]]] = []
        """The reservations of this cycle with a known start: (start, the nodes held)."""
        self.quota = None if snapshot.quotas is None else QuotaCycle(snapshot.quotas, self.index, snapshot.running)
        """The queues' quotas, fair share and reclaim (``placement.quota``); None: one queue, no quotas."""

    def _rank(self, job: PendingJob) -> QueueKey:
        return queue_key(job, self.policy, self.now)

    def queue(self, pending: Sequence[PendingJob]) -> tuple[list[PendingJob], list[Invalid]]:
        """The jobs in queue order (``candidate.queue_key``, by ``Policy.order``), and those whose data cannot even
        be ranked."""
        ranked: list[tuple[QueueKey, PendingJob]] = []
        invalid: list[Invalid] = []
        for job in pending:
            try:
                ranked.append((self._rank(job), job))
            except Exception as exc:  # e.g. a priority too large for a float: that job, not the queue
                invalid.append(invalid_job(job, exc))
        ranked.sort(key=lambda entry: entry[0])
        return [job for _, job in ranked], invalid

    def decide_safely(self, pending_job: PendingJob) -> list[Decision]:
        """``decide``, with a job whose data makes deciding raise decided :class:`Invalid`."""
        try:
            return self.decide(pending_job)
        except Exception as exc:  # one job's bad data fails that job, never the cycle
            return [invalid_job(pending_job, exc)]

    def decide(self, pending_job: PendingJob) -> list[Decision]:
        """The decisions for one job: [Place], [Preempt..., Unschedulable(PREEMPTING)] or [Unschedulable]."""
        index, policy = self.index, self.policy
        if claims.give_back(index, pending_job.spec.job_id):
            self.unplaceable.clear()  # nodes held for it alone: what failed before it may fit it
        if pending_job.not_before is not None and self.now < pending_job.not_before:
            wait = (pending_job.not_before - self.now).total_seconds()
            message = f"recovering: retry backoff, next attempt in {wait:.1f}s"
            return [Unschedulable(pending_job.spec.job_id, PendingReason.RETRY_BACKOFF, message)]
        quota = self.quota
        job = Candidate(pending_job, index, self.now, None if quota is None else quota.allowed(pending_job))
        shape = job.shape()
        known = self.unplaceable.get(shape)
        if known is not None:
            backfilled = self.backfill(job, shape)
            return [backfilled] if backfilled is not None else [replace(known, job_id=job.spec.job_id)]
        placed = place_gang(index, job, self.links) if job.eligible else None
        if placed is None:
            placed = self.backfill(job, shape) or place_smaller(index, job, self.links)
        if placed is not None:
            self._hold_placed(pending_job, placed)
            return [placed]
        verdict, passing = explain_sized(index, job, self.now)
        if verdict.reason is PendingReason.NEVER_FITS:  # no preemption or reservation would make room
            self.unplaceable[shape] = verdict
            return [verdict]
        if quota is not None and verdict.reason is PendingReason.QUOTA_EXCEEDED:
            return self._over_quota(job, verdict)
        victims = self.waiting_on.get(job.spec.job_id)
        if victims:
            hold_room(index, job, victims)
            return [preempting_verdict(verdict, victims)]
        if policy.preemption and verdict.reason is not PendingReason.WAITING_FOR_ARTIFACT and job.eligible:
            if self._victims is None:
                self._victims = victim_order(self.running, policy, self.now)
            chosen = choose_in(
                self.quota, self.index, job, self._victims, self.running, passing, self.now, self._stopping
            )
            if chosen:
                hold_room(index, job, chosen)
                self._stopping.update(victim.job_id for victim in chosen)
                return [
                    *(Preempt(victim.job_id, job.spec.job_id) for victim in chosen),
                    preempting_verdict(verdict, chosen),
                ]
        self.unplaceable[shape] = verdict
        waited_s = (self.now - job.pending.ready_at).total_seconds()
        if self.reservations > 0 and verdict.reason in RESERVABLE and waited_s >= policy.reserve_after_s:
            self.reservations -= 1
            held = reserve_for(index, job)
            start = self.start_of(held)
            if start is not None:
                self.held.append((start, held))
                self._no_backfill.clear()  # more nodes to lend now
                return [replace(verdict, estimated_start=start)]
        return [verdict]

    def _over_quota(self, job: Candidate, verdict: Unschedulable) -> list[Decision]:
        """A job its queue has no headroom for: it preempts the gangs of its queue it outranks that give the queue
        the room (``QuotaCycle.freeing``), and those the gang then needs to fit, or waits ``QUOTA_EXCEEDED`` naming
        its queue and models."""
        quota, pending = self.quota, job.pending
        assert quota is not None
        models = [job.spec.gpu_model] if job.spec.gpu_model and not job.degraded else list(quota.capacity)
        verdict = replace(verdict, message=f"{quota.why(pending, models)}; {verdict.message}")
        victims = self.waiting_on.get(job.spec.job_id)
        if victims:
            hold_for(self.index, victims, job.spec.job_id)
            return [preempting_verdict(verdict, victims)]
        if not self.policy.preemption:
            return [verdict]
        if self._victims is None:
            self._victims = victim_order(self.running, self.policy, self.now)
        own = [
            gang
            for gang in outranked(job, self._victims, self.policy, self.now)
            if gang.queue == job.spec.queue and gang.job_id not in self._stopping
        ]
        model, freeing = quota.freeing(pending, models, own)
        there = Candidate(pending, self.index, self.now, frozenset({model})) if freeing else None
        if there is None or not there.eligible:
            return [verdict]
        physical, passing = explain(self.index, there, self.now)
        if physical.reason not in RESERVABLE and physical.reason is not PendingReason.QUOTA_EXCEEDED:
            return [verdict]  # something other than GPUs keeps it out (data, disks): no room is worth a preemption
        freed = {gang.job_id for gang in freeing}
        room = passing + gain(self.index, there, freeing)  # what the quota's own victims free
        more = make_room(self.index, there, (g for g in own if g.job_id not in freed), room, self.now)
        if not more and room < there.k:
            return [verdict]
        chosen = [*freeing, *more]
        hold_for(self.index, chosen, job.spec.job_id)
        self._stopping.update(victim.job_id for victim in chosen)
        return [*(Preempt(victim.job_id, job.spec.job_id) for victim in chosen), preempting_verdict(verdict, chosen)]

    def _hold_placed(self, job: PendingJob, placed: Place) -> None:
        """A gang placed this cycle holds its nodes, until its expected end, for a reservation there too."""
        gang = self._as_gang(job, placed)
        for node_id in dict.fromkeys(node_id for node_id, _gpus in gang.shards):
            self._placed_on.setdefault(node_id, []).append(gang)
        if self.quota is not None:
            self.quota.placed(job, placed)

    def gangs_at(self, node_id: str) -> list[RunningJob]:
        """The gangs holding GPUs on ``node_id`` (when a reservation there can start): the snapshot's, from its
        ``gangs_on`` or, without one, a map built from ``running`` when first needed; then this cycle's."""
        if self._gangs_on is None:
            built: dict[str, list[RunningJob]] = {}
            for gang in self.running:
                for node in dict.fromkeys(node for node, _gpus in gang.shards):
                    built.setdefault(node, []).append(gang)
            self._gangs_on = built
        return [*self._gangs_on.get(node_id, ()), *self._placed_on.get(node_id, ())]

    def start_of(self, held: Sequence[Slot]) -> datetime | None:
        """When a reservation of ``held`` can start: once the last gang on those nodes is expected to have ended
        (:func:`overrun_end`). None when nothing is held, or a gang there has no expected end."""
        if not held:
            return None
        start = self.now
        for slot in held:
            for gang in self.gangs_at(slot.node_id):
                if gang.expected_end is None:
                    return None
                start = max(start, overrun_end(gang, self.now))
        return start

    def with_estimates(self, queued: Sequence[PendingJob], decisions: list[Decision]) -> list[Decision]:
        """``decisions``, with a p50 and p90 start (``placement.intervals``) on the first ``Policy.start_estimates``
        jobs, in queue order, that wait on capacity."""
        verdicts = {d.job_id: d for d in decisions if isinstance(d, Unschedulable) and d.reason in RESERVABLE}
        waiting: list[Queued] = []
        for job in queued:
            if len(waiting) >= self.policy.start_estimates:
                break
            verdict = verdicts.get(job.spec.job_id)
            if verdict is not None:
                waiting.append(self._queued(job))
        if not waiting:
            return decisions
        free, groups = free_now(self.index.slots.values())
        jobs = {job.spec.job_id: job for job in queued}
        placed = [self._as_gang(jobs[d.job_id], d) for d in decisions if isinstance(d, Place) and d.job_id in jobs]
        gangs = [(gang, per_group(gang, groups)) for gang in (*self.running, *placed)]
        found = plan_intervals(free, gangs, waiting, now=self.now, policy=self.policy)
        return [
            replace(d, estimated_start=found[d.job_id].p50, estimated_start_p90=found[d.job_id].p90)
            if isinstance(d, Unschedulable) and d.job_id in found
            else d
            for d in decisions
        ]

    def _queued(self, job: PendingJob) -> Queued:
        scores = Candidate(job, self.index, self.now).eligible
        ran_s = job.attained_gpu_s / max(1, job.spec.gpu_count)
        return Queued(
            job.spec.job_id,
            job.spec.gpu_count,  # spares are never a reason to wait
            sorted(scores, key=lambda key: -scores[key]),
            [max(1.0, q - ran_s) for q in job.run_quantiles],
            job.expected_run_s,
        )

    def _as_gang(self, job: PendingJob, placed: Place) -> RunningJob:
        """A gang placed this cycle, as the plans see it: holding its GPUs from now for its expected run."""
        run_s = job.expected_run_s
        return RunningJob(
            job.spec.job_id,
            job.spec.priority,
            job.spec.preemptible,
            self.now,
            tuple((shard.node_id, shard.gpu_indices) for shard in placed.placements),
            attained_gpu_s=job.attained_gpu_s,
            expected_end=None if run_s is None else self.now + timedelta(seconds=run_s),
            run_quantiles=job.run_quantiles,
        )

    def backfill(self, job: Candidate, shape: tuple[object, ...]) -> Place | None:
        """Time-aware backfill: place ``job`` on the nodes of the reservations that start after it is expected to
        end (``Policy.backfill``), then hold them again for their jobs. None when it has no expected run time,
        no reservation starts late enough, or it does not fit even so.

        A job of a ``shape`` that failed to backfill this cycle with an expected run no longer than its own fails
        too (it may borrow no more nodes, and placing only takes room), so it is not tried again until another
        reservation is made."""
        expected = job.pending.expected_run_s
        if not (self.policy.backfill and self.held and expected is not None and job.eligible):
            return None
        failed = self._no_backfill.get(shape)
        if failed is not None and expected >= failed:
            return None
        placed = self._backfill(job, expected)
        if placed is None:
            self._no_backfill[shape] = expected if failed is None else min(failed, expected)
        return placed

    def _backfill(self, job: Candidate, expected: float) -> Place | None:
        ends = self.now + timedelta(seconds=expected)
        lent = [(slot, slot.reserved_for) for start, held in self.held if ends <= start for slot in held]
        if not lent:
            return None
        for slot, _holder in lent:
            self.index.unreserve(slot)
        try:
            return place_gang(self.index, job, self.links)
        finally:
            for slot, holder in lent:
                if holder is not None:
                    self.index.reserve(slot, holder)


def schedule(
    snapshot: Snapshot,
    pending: Sequence[PendingJob],
    policy: Policy | None = None,
    *,
    now: datetime,
    index: StandingIndex | None = None,
) -> list[Decision]:
    """Decide for every pending job, in queue order. Returns Place, Preempt and Unschedulable decisions. With
    ``index`` (a standing index of ``snapshot``'s nodes), the cycle works on it and leaves it as it found it."""
    if index is not None:
        index.begin()
    try:
        cycle = PlacementCycle(snapshot, policy, now=now, index=index)
        claims.hold(cycle.index, {job.spec.job_id for job in pending}, snapshot.running)
        queued, invalid = cycle.queue(pending)
        decisions: list[Decision] = [*invalid]
        if cycle.quota is not None:
            turns = list[PendingJob]()
            for job in cycle.quota.turns(queued):  # between queues by fair share, placing as it goes
                turns.append(job)
                decided = cycle.decide_safely(job)
                decisions.extend(decided)
                if any(isinstance(d, Unschedulable) and d.reason in CLAIMING for d in decided):
                    cycle.quota.unplaced(job)
            queued = turns
        else:
            for job in queued:
                decisions.extend(cycle.decide_safely(job))
        return cycle.with_estimates(queued, decisions)
    finally:
        if index is not None:
            index.rollback()


def invalid_job(job: PendingJob, exc: Exception) -> Invalid:
    return Invalid(job.spec.job_id, f"the scheduler cannot place this job: {type(exc).__name__}: {exc}"[:500])


def place_one(nodes: Sequence[NodeView], job: PendingJob, policy: Policy | None = None, *, now: datetime) -> Decision:
    """The decision for one job alone on ``nodes`` (tests, the simulator's what-ifs)."""
    return schedule(Snapshot(tuple(nodes)), [job], policy, now=now)[-1]
