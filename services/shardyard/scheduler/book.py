"""The scheduler's state (rebuilt from the log) and its decisions, as events to publish. Pure: time comes in.

``apply`` takes facts (also during the start-up replay) and never decides; ``cycle``, ``on_shard_event``,
``on_recovering``, ``on_cancel`` and ``revocations`` return the events that carry out decisions. The book decides under
``term``, the term its replica was elected under (``take_over``); the terms it reads are a fence (see ``fencing``),
never its own. The book holds the state and takes the facts in; the rules live in its parts, pure: ``admission``
(the events of a placement), ``preemption``, ``reform`` (re-forming a recovering gang), ``resize`` (growing and
shrinking elastic gangs), ``completion`` (what shard facts add up to), ``cancellation``, ``start_deadline`` and
``orphans``. Parts that keep state of their own own it:
the fence's record of placements (``fencing``), the cancel requests, the pending reasons, the orphan check's pace.
"""

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from shardyard.events import (
    Event,
    FailureCause,
    JobCancelRequested,
    JobFailed,
    JobRecovering,
    ResizeReason,
    RevocationReason,
)
from shardyard.placement.cycle import schedule
from shardyard.placement.filters import EXCLUDED
from shardyard.placement.model import Invalid, NodeView, Place, Preempt, Snapshot, Unschedulable
from shardyard.placement.surplus import surplus_of
from shardyard.scheduler import preemption, resize
from shardyard.scheduler.admission import admit, first_free, ports_in_use, waits_for_spares
from shardyard.scheduler.cancellation import cancellation
from shardyard.scheduler.completion import settle
from shardyard.scheduler.facts import BookFacts
from shardyard.scheduler.fencing import stale_revocations
from shardyard.scheduler.gang import Gang, revoke_unfinished
from shardyard.scheduler.reform import Ground, reform
from shardyard.scheduler.start_deadline import timed_out
from shardyard.stragglers import health

GROW_CHECK_S = 1.0
"""Elastic gangs are looked at for growth at most this often (each look places their new shards on a snapshot)."""


class SchedulerBook(BookFacts):
    """The scheduler's decisions over what ``BookFacts`` knows (see the module's doc)."""

    _cycle_ports: dict[str, set[int]] | None = None
    """During a cycle's decisions: node -> the rendezvous ports its gangs hold (``cycle``)."""
    _grow_checked: datetime | None = None
    """When the cycle last looked for elastic gangs to grow."""

    # --- the snapshot ------------------------------------------------------------------------------------------
    def snapshot(self, now: datetime | None = None) -> Snapshot:
        """The nodes and gangs as the cycle decides on them; with ``now``, the measured links fresh at ``now`` too."""
        stopping = self.shrinks.stopping(self.running, now, self.preempt_deadline_s)
        snapshot = self._views.snapshot(
            self.nodes, self.gangs.values(), self.attained, self.expected, stopping, spreads=self.spreads
        )
        if self.queues is not None:
            snapshot = replace(snapshot, quotas=self.queues.config)
        if now is None:
            return snapshot
        links, degraded = self.links.figures(now), health.degraded_now(self.degraded, now)
        snapshot = replace(snapshot, rtt_ms=links.rtt_ms, mean_rtt_ms=links.mean_rtt_ms, slow_nodes=links.slow_nodes)
        return replace(snapshot, degraded=degraded)

    # --- decisions ---------------------------------------------------------------------------------------------
    def cycle(self, now: datetime) -> list[Event]:
        """One scheduling cycle: fenced placements are revoked, overdue preemptions end, cancelled jobs leave,
        shards past their start deadline and orphaned shards are revoked and failed, every pending job is decided
        (a job that cannot be decided for fails, alone)."""
        # 1. Settle what is due, taking each end in before the next phase: a shard failed at its start deadline is
        #    not found orphaned too, and a cancelled job is not placed.
        out = self._revoke_stale(now)
        out.extend(self._overdue_preemptions(now))
        for request in self.cancels.due([*self.pending, *self.gangs], now):
            out.extend(self.on_cancel(request, now))
        out.extend(self._decided(self._overdue_starts(now)))
        out.extend(self._decided(self._orphans(now)))
        # 2. Decide for every pending job on one snapshot, and carry the decisions out; then elastic gangs grow into
        #    what no waiting job can use.
        self.reasons.new_cycle()
        if self.pending:
            out.extend(self._decide(now))
        return out + self._grow(now)

    def _decide(self, now: datetime) -> list[Event]:
        out: list[Event] = []
        snapshot = self.snapshot(now)
        by_id = self._views.views  # the snapshot's views, by node id
        # The rendezvous ports in use, once a cycle (each admission adds its own): looked up per gang placed, a walk
        # of every gang made a burst's cycle quadratic in the gangs.
        self._cycle_ports = ports_in_use(self.gangs.values())
        # Spares follow the ratio in force now; exclusions that healed since the job was queued end now.
        queue = [
            replace(job, spares=self._spares(job.spec), excluded_nodes=self.kept_off(job.spec.job_id, now))
            for job in self.pending.values()
        ]
        shrinks: dict[str, dict[int, str]] = {}  # job -> its surplus shards the cycle took -> whom for
        try:
            # Start estimates are dear: made only in the cycles ``reasons`` asks for.
            estimating = self.reasons.estimating(self.pending, now)
            policy = self.policy if estimating else replace(self.policy, start_estimates=0)
            decisions = self.reasons.corrected(schedule(snapshot, queue, policy, now=now, index=self._views.index), now)
            for decision in decisions:
                if isinstance(decision, Place):
                    self.reasons.placed(decision.job_id, now)
                if isinstance(decision, Preempt) and (surplus := surplus_of(decision.job_id)) is not None:
                    shrinks.setdefault(surplus[0], {})[surplus[1]] = decision.by_job
                    continue  # carried out once the cycle is decided: one re-formation per gang
                try:
                    out.extend(self._carry_out(decision, by_id, now))
                except Exception as exc:  # one job's bad data fails that job, never the cycle
                    if not isinstance(decision, Preempt):  # a victim is a placed job: its preemption is just not made
                        out.extend(self._invalid(Invalid(decision.job_id, f"{type(exc).__name__}: {exc}"[:500]), now))
            out.extend(self._shrink(shrinks, snapshot, now))
        finally:
            self._cycle_ports = None
        return out + self._unschedulable(now)

    # --- resizing elastic gangs (see ``resize``) ----------------------------------------------------------------
    def _shrink(self, shrinks: dict[str, dict[int, str]], snapshot: Snapshot, now: datetime) -> list[Event]:
        """Re-form each gang the cycle took surplus shards of without them."""
        out: list[Event] = []
        for job_id, dropped in shrinks.items():
            gang = self.gangs.get(job_id)
            if gang is None or gang.preempted_by is not None:
                continue  # placed no more, or stopping whole for another job
            by_job = min(dropped.values())
            reason = resize.shrink_reason(gang.spec, self.specs.get(by_job))
            place = resize.shrunk(gang, set(dropped), self._ground(job_id, snapshot))
            out.extend(self._resize(gang, place, reason, by_job, now))
        return out

    def _grow(self, now: datetime) -> list[Event]:
        """Grow the elastic gangs that may (``resize.may_grow``) into free GPUs no waiting job could use; looked for
        at most every ``GROW_CHECK_S``."""
        if self._grow_checked is not None and (now - self._grow_checked).total_seconds() < GROW_CHECK_S:
            return []
        self._grow_checked = now
        growing = [g for g in self.gangs.values() if resize.may_grow(g, now, self.resize_cooldown_s)]
        if not growing:
            return []
        verdicts = {spec.job_id: reason for spec, reason, _since in self.reasons.blocked}
        out: list[Event] = []
        for gang in sorted(growing, key=lambda g: (-g.spec.priority, g.scheduled.occurred_at)):
            waiting = [job.spec for job in self.pending.values()]
            if any(resize.blocks_growth(spec, verdicts.get(spec.job_id), gang.spec) for spec in waiting):
                continue
            job_id = gang.spec.job_id
            place = resize.grown(gang, self.kept_off(job_id, now), self._ground(job_id, self.snapshot(now)), now)
            out.extend(self._resize(gang, place, ResizeReason.GROW_INTO_IDLE, None, now))
        return out

    def _ground(self, job_id: str, snapshot: Snapshot) -> Ground:
        views = {view.node_id: view for view in snapshot.nodes}
        return Ground(self.nodes, snapshot, views, lambda view: self._free_port(view, job_id), self.policy)

    def _resize(
        self, gang: Gang, place: Place | None, reason: ResizeReason, by_job: str | None, now: datetime
    ) -> list[Event]:
        """Re-form ``gang`` as ``place`` (None: it stays as it is): its shards stop, keeping their live state, and
        the next attempt starts at once, resuming from it."""
        if place is None:
            return []
        event = resize.resized(gang, place, reason, by_job, now)
        revoked = revoke_unfinished(gang, RevocationReason.RESIZING, event.message, term=self.term, now=now)
        announced = self._decided([event])  # the attempt ends; the job is pending for the next one
        return [*revoked, *announced, *self._admit(place, self._views.views, now)]

    def _carry_out(
        self, decision: Place | Preempt | Unschedulable | Invalid, by_id: dict[str, NodeView], now: datetime
    ) -> list[Event]:
        if isinstance(decision, Place):
            if self._short_of_spares(decision, now):
                return []  # capacity (or an artifact report) for the spares may show within the grace
            return self._admit(decision, by_id, now)
        if isinstance(decision, Preempt):
            return self._preempt(decision, now)
        if isinstance(decision, Invalid):
            return self._invalid(decision, now)
        kept_off = self.exclusions.describe(decision.job_id, now) if decision.node_counts.get(EXCLUDED) else ""
        if kept_off:  # which nodes, and until when: the wait has an end
            decision = replace(decision, message=f"{decision.message}; {kept_off}")
        return self.reasons.unschedulable(decision, self.pending[decision.job_id], now)

    def _invalid(self, decision: Invalid, now: datetime) -> list[Event]:
        """End a job no cycle can decide for: FAILED ``INVALID_SPEC``, with what broke."""
        if decision.job_id in self.finished:
            return []
        failed = JobFailed(
            occurred_at=now,
            job_id=decision.job_id,
            attempt=self.fence.attempt(decision.job_id),
            cause=FailureCause.INVALID_SPEC,
            message=decision.message,
        )
        return self._decided([failed])

    def _unschedulable(self, now: datetime) -> list[Event]:
        """End the jobs that waited ``NEVER_FITS`` for ``unschedulable_after_s``: FAILED ``UNSCHEDULABLE``, with why."""
        bound_s = self.unschedulable_after_s
        ended: list[Event] = [
            JobFailed(
                occurred_at=now,
                job_id=job_id,
                attempt=self.fence.attempt(job_id),
                cause=FailureCause.UNSCHEDULABLE,
                message=f"never fitted this cluster in {bound_s:g}s (the scheduler's unschedulable_after_s): {why}",
            )
            for job_id, why in self.reasons.past_bound(now, bound_s)
            if job_id in self.pending and job_id not in self.finished
        ]
        return self._decided(ended)

    def _revoke_stale(self, now: datetime) -> list[Event]:
        """Revoke what fenced and superseded placements assigned (see ``fencing``), under this book's term."""
        out: list[Event] = []
        for placement in self.fence.take_stale():
            gang = self.gangs.get(placement.job_id)
            out.extend(stale_revocations(placement, gang.scheduled if gang else None, term=self.term, now=now))
        return out

    def _orphans(self, now: datetime) -> list[Event]:
        """Revoke the shards no node reports running past their start deadline and the grace, and report them failed
        ``ORPHANED`` (see ``orphans``)."""
        deadline_s, grace_s = self.start_deadline_s, self.reservation_grace_s
        return self.orphan_check.run(
            self.gangs.values(), self.nodes, self.running, now, deadline_s=deadline_s, grace_s=grace_s, term=self.term
        )

    def _overdue_starts(self, now: datetime) -> list[Event]:
        """Revoke the shards not started by their start deadline and report them failed (see ``start_deadline``)."""
        return timed_out(self.gangs.values(), deadline_s=self.start_deadline_s, term=self.term, now=now)

    def _short_of_spares(self, place: Place, now: datetime) -> bool:
        job, first = self.pending[place.job_id], self.fence.attempt(place.job_id) == 0
        wanted, grace_s = self._spares(job.spec), self.spare_grace_s
        return waits_for_spares(place, job, wanted=wanted, first=first, grace_s=grace_s, now=now)

    def elasticity_signals(self, now: datetime) -> list[Event]:
        """Capacity requests and reclaim candidates from the last cycle's verdicts (called once a tick: O(nodes))."""
        return self.elasticity.observe(self.reasons.blocked, self.nodes, self._busy_nodes(), now)

    def _busy_nodes(self) -> set[str]:
        return {shard.node_id for gang in self.gangs.values() for shard in gang.scheduled.placements}

    def _admit(self, place: Place, nodes: dict[str, NodeView], now: datetime) -> list[Event]:
        """Carry out a placement as the job's next attempt, and take it in at once (its echo changes nothing)."""
        spec = self.pending[place.job_id].spec
        attempt = self.fence.next_attempt(place.job_id)
        coordinator = nodes[place.coordinator_node]
        # The view's ports were free at the snapshot; gangs admitted earlier in this cycle took some of them.
        port = self._free_port(coordinator, place.job_id) or coordinator.rendezvous_ports[-1]
        scheduled, assignments = admit(
            place,
            spec,
            coordinator,
            attempt=attempt,
            term=self.term,
            port=port,
            output_path=f"{self.checkpoint_root}/{spec.job_id}",
            resume_from=self.resume.get(place.job_id),
            now=now,
            notice_s=self.preempt_deadline_s,
        )
        self.apply(scheduled)
        if self._cycle_ports is not None:
            self._cycle_ports.setdefault(coordinator.node_id, set()).add(port)
        self.reasons.forget(place.job_id)
        return [scheduled, *assignments]

    def _free_port(self, view: NodeView, job_id: str) -> int | None:
        used = self._cycle_ports if self._cycle_ports is not None else ports_in_use(self.gangs.values())
        return first_free(view, used.get(view.node_id, set()), self.last_port.get(job_id))

    def _preempt(self, decision: Preempt, now: datetime) -> list[Event]:
        """Ask every shard of the victim to checkpoint and stop; the gang ends when all have (or at the deadline)."""
        gang = self.gangs.get(decision.job_id)
        if gang is None or gang.preempted_by is not None:
            return []  # placed no more, or stopping for another job already
        marker, requests = preemption.preempting(
            gang, decision.by_job, term=self.term, deadline_s=self.preempt_deadline_s, now=now
        )
        return [*self._decided([marker]), *requests]

    def _overdue_preemptions(self, now: datetime) -> list[Event]:
        """End the preemptions past their deadline: what still runs is revoked, and the job requeued."""
        out: list[Event] = []
        for job_id, gang in list(self.gangs.items()):
            if preemption.overdue(gang, now):
                out.extend(preemption.revoke_overdue(gang, term=self.term, now=now))
                out.extend(self._end_preemption(job_id, gang, now))
        return out

    def _end_preemption(self, job_id: str, gang: Gang, now: datetime) -> list[Event]:
        return self._decided([preemption.preempted(gang, self.resume.get(job_id), now)])

    def on_shard_event(self, now: datetime, jobs: Iterable[str] | None = None) -> list[Event]:
        """Gang-level consequences of shard facts (see ``completion``), taken in as they are decided. For the gangs
        of ``jobs`` (those a fact was about), or every gang (a new leader carrying out what is due)."""
        out: list[Event] = []
        chosen = self.gangs.items() if jobs is None else [(j, self.gangs[j]) for j in jobs if j in self.gangs]
        for job_id, gang in list(chosen):
            out.extend(self._decided(settle(gang, resume_from=self.resume.get(job_id), term=self.term, now=now)))
        return out

    def on_recovering(self, plan: JobRecovering, now: datetime) -> list[Event]:
        """Carry out the fault manager's plan: stop what is left of the failed attempt and, when no backoff applies,
        re-form the gang at once on the surviving shards' GPUs (see ``reform``); the new attempt resumes from the last
        checkpoint without waiting for a placement cycle. When that does not fit, or a backoff applies, the job is
        requeued and placed afresh."""
        gang = self.gangs.get(plan.job_id)
        if gang is None or gang.scheduled.attempt != plan.attempt or plan.job_id in self.finished:
            self.apply(plan)
            return []
        message = f"recovering: {plan.cause}"
        out: list[Event] = [*revoke_unfinished(gang, RevocationReason.RECOVERING, message, term=self.term, now=now)]
        before = self.snapshot(now)  # the failed gang's GPUs still count as taken: replacements go elsewhere
        self.apply(plan)
        if plan.retry_at > now:
            return out
        views = {view.node_id: view for view in self.snapshot().nodes}
        ground = Ground(self.nodes, before, views, lambda view: self._free_port(view, plan.job_id), self.policy)
        avoided = self.kept_off(plan.job_id, now)  # its exclusions, and no survivor on a full disk
        reformed = reform(gang, avoided, ground, now)
        if reformed is not None:
            out.extend(self._admit(reformed, views, now))
        return out

    def on_cancel(self, request: JobCancelRequested, now: datetime) -> list[Event]:
        """Cancel a job the scheduler holds (pending or placed); the queue cancels jobs still waiting on parents."""
        job_id = request.job_id
        if job_id in self.finished:
            return []
        if job_id not in self.pending and job_id not in self.gangs:
            self.apply(request)  # remembered: carried out if the job becomes ready here
            return []
        revoked, cancelled = cancellation(request, self.gangs.get(job_id), term=self.term, now=now)
        return [*revoked, *self._decided([cancelled])]

    def revocations(self, failed: JobFailed, now: datetime) -> list[Event]:
        """Stop the shards of a failed job that are still running, so its GPUs are freed at once."""
        gang = self.gangs.get(failed.job_id)
        if gang is None:
            return []
        message = f"job failed: {failed.cause}"
        return [*revoke_unfinished(gang, RevocationReason.JOB_FAILED, message, term=self.term, now=now)]
