"""The scheduler's state (rebuilt from the log) and its decisions, as events to publish. Pure: time comes in.

``apply`` takes facts (also during the start-up replay) and never decides; ``cycle``, ``on_shard_event``,
``on_recovering``, ``on_cancel`` and ``revocations`` return the events that carry out decisions. The book decides under
``term``, the term its replica was elected under (``take_over``); the terms it reads are a fence (see ``fencing``),
never its own. The book holds the state and takes the facts in; the rules live in its parts, pure: ``admission``
(the events of a placement), ``preemption``, ``reform`` (re-forming a recovering gang), ``completion`` (what shard
facts add up to), ``cancellation``, ``start_deadline`` and ``orphans``. Parts that keep state of their own own it:
the fence's record of placements (``fencing``), the cancel requests, the pending reasons, the orphan check's pace.
"""

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime

from shardyard.events import (
    Event,
    FailureCause,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPreempted,
    JobPreempting,
    JobReady,
    JobRecovering,
    JobRunning,
    JobScheduled,
    JobSpec,
    JobSucceeded,
    NodeState,
    RedundancyChanged,
    RevocationReason,
    ShardCheckpointed,
    ShardCompleted,
    ShardFailed,
    ShardPreempted,
    ShardStarted,
)
from shardyard.placement.cycle import schedule
from shardyard.placement.estimates import DurationEstimates, EstimateKey
from shardyard.placement.model import Invalid, NodeView, PendingJob, Place, Policy, Preempt, Snapshot, Unschedulable
from shardyard.placement.snapshot import SnapshotCache
from shardyard.scheduler import preemption
from shardyard.scheduler.admission import admit, free_port, spares, waits_for_spares
from shardyard.scheduler.cancellation import CancelRequests, cancellation
from shardyard.scheduler.completion import settle
from shardyard.scheduler.elasticity import ElasticityTracker
from shardyard.scheduler.fencing import Fence, stale_revocations
from shardyard.scheduler.gang import Gang, revoke_unfinished
from shardyard.scheduler.orphans import OrphanCheck, ShardKey, running_keys
from shardyard.scheduler.reasons import PendingReasons
from shardyard.scheduler.reform import Ground, reform
from shardyard.scheduler.start_deadline import timed_out


class SchedulerBook:
    def __init__(
        self,
        *,
        term: int = 1,
        checkpoint_root: str = "/data/checkpoints",
        policy: Policy | None = None,
        preempt_deadline_s: float = 30.0,
        start_deadline_s: float = 60.0,
        reservation_grace_s: float = 30.0,
        spare_grace_s: float = 2.0,
        elasticity: ElasticityTracker | None = None,
    ) -> None:
        self.term = term
        """The term this book decides under: its replica's, once elected. Never raised by what it reads."""
        self.checkpoint_root = checkpoint_root.rstrip("/")
        self.policy = policy or Policy()
        self.preempt_deadline_s = preempt_deadline_s
        self.start_deadline_s = start_deadline_s
        self.reservation_grace_s = reservation_grace_s
        self.spare_grace_s = spare_grace_s
        self.elasticity = elasticity or ElasticityTracker()
        self.nodes: dict[str, NodeState] = {}
        self.running: dict[str, frozenset[ShardKey]] = {}
        """Node -> the shards its agent reports running (its last state's)."""
        self._views = SnapshotCache(self.policy)
        """The nodes' views for placement, kept between cycles (rebuilt only where a node or its gangs changed)."""
        self.specs: dict[str, JobSpec] = {}
        self.pending: dict[str, PendingJob] = {}
        self.gangs: dict[str, Gang] = {}
        self.resume: dict[str, str] = {}
        """Job -> checkpoint (job path) its next attempt resumes from."""
        self.resume_step: dict[str, int] = {}
        self.spare_ratio = 0.0
        """The fault manager's redundancy ratio: new gangs get ceil(shards x ratio) spares."""
        self.excluded: dict[str, frozenset[str]] = {}
        self.last_port: dict[str, tuple[str, int]] = {}
        """Job -> (node, port) of its latest rendezvous: a new attempt takes another port."""
        self.fence = Fence()
        """The placements read so far, which judge the next ones (see ``fencing``) and number their attempts."""
        self.orphan_check = OrphanCheck()
        """Looks for orphaned shards, at most once a second (see ``orphans``)."""
        self.attained: dict[str, float] = {}
        """Job -> GPU-seconds its ended attempts held GPUs for (its least-attained-service queue)."""
        self.estimates = DurationEstimates()
        """Run times learned from the jobs that succeeded, for the jobs that declare none."""
        self.expected: dict[str, float] = {}
        """Job -> its whole expected run time, declared or estimated when it was last ready (none: unknown)."""
        self.finished: set[str] = set()
        self.reasons = PendingReasons()
        """Why each pending job is not placed: shown when it changes, and the last cycle's verdicts."""
        self.cancels = CancelRequests()
        """Cancel requests kept until their job ends (see ``cancellation``)."""

    # --- facts -------------------------------------------------------------------------------------------------
    def apply(self, event: object) -> None:
        match event:
            case NodeState():
                self.nodes[event.node_id] = event
                self.running[event.node_id] = running_keys(event)
                self._views.changed(event.node_id)
            case JobReady() if event.job_id not in self.finished and event.job_id not in self.gangs:
                self.specs[event.job_id] = event.spec
                self.pending[event.job_id] = self._pending(event.spec, event.occurred_at)
            case RedundancyChanged():
                self.spare_ratio = event.ratio
            case ShardCheckpointed() if event.step >= self.resume_step.get(event.job_id, -1):
                self.resume[event.job_id] = event.checkpoint_dir
                self.resume_step[event.job_id] = event.step
            case JobRecovering() if event.job_id not in self.finished:
                self._requeue_recovering(event)
            case JobScheduled():
                self._on_scheduled(event)
            case JobRunning() if event.job_id in self.gangs:
                self.gangs[event.job_id].running = True
            case JobPreempted() if event.job_id not in self.finished:
                self._requeue_preempted(event)
            case JobCancelRequested() if event.job_id not in self.finished:
                self.cancels.note(event)
            case JobSucceeded():
                self._learn(event.job_id, event.occurred_at)
                self._finish(event.job_id)
            case JobFailed() | JobCancelled():
                self._finish(event.job_id)
            case JobPreempting() | ShardStarted() | ShardFailed() | ShardCompleted() | ShardPreempted():
                gang = self.gangs.get(event.job_id)
                if gang is not None and gang.scheduled.attempt == event.attempt:  # another attempt's is no news
                    gang.record(event)
            case _:
                pass

    def _requeue_recovering(self, plan: JobRecovering) -> None:
        """The failed attempt ends: the job waits for its next one, off the plan's excluded nodes, not before its
        backoff."""
        gang = self.gangs.get(plan.job_id)
        if gang is not None and gang.scheduled.attempt > plan.attempt:
            return  # a plan for an attempt already replaced
        self._attempt_ended(self.gangs.pop(plan.job_id, None), plan.occurred_at)
        self.excluded[plan.job_id] = self.excluded.get(plan.job_id, frozenset()) | set(plan.exclude_nodes)
        spec = self.specs.get(plan.job_id)
        if spec is not None:
            self.pending[plan.job_id] = self._pending(spec, plan.occurred_at, not_before=plan.retry_at)

    def _requeue_preempted(self, event: JobPreempted) -> None:
        ended = self.gangs.pop(event.job_id, None)
        self._attempt_ended(ended, event.occurred_at)
        spec = ended.spec if ended is not None else self.specs.get(event.job_id)
        if event.checkpoint_dir:
            self.resume[event.job_id] = event.checkpoint_dir
        if spec is not None:
            self.pending[event.job_id] = self._pending(spec, event.occurred_at, excluded=False)

    def _attempt_ended(self, gang: Gang | None, at: datetime) -> None:
        """An attempt ended at ``at``: the GPU-seconds it held count as the job's attained service."""
        if gang is not None:
            held_s = max(0.0, (at - gang.scheduled.occurred_at).total_seconds())
            job_id = gang.spec.job_id
            self.attained[job_id] = self.attained.get(job_id, 0.0) + held_s * gang.spec.gpu_count

    def _learn(self, job_id: str, at: datetime) -> None:
        """A job succeeded at ``at``: its run time (all its attempts) teaches the estimates. A failed or cancelled
        job's does not: it is not how long such a job runs."""
        gang, spec = self.gangs.get(job_id), self.specs.get(job_id)
        if gang is None or spec is None:
            return  # ended before this replica saw it placed: its run time is not known here
        ran_s = self.attained.get(job_id, 0.0) / max(1, spec.gpu_count)
        self.estimates.observe(EstimateKey.of(spec), ran_s + (at - gang.scheduled.occurred_at).total_seconds())

    def _finish(self, job_id: str) -> None:
        """The job ended: what was kept to run it goes; what numbers and fences its placements stays, so that a late
        placement of it is still judged (see ``fencing``)."""
        self.cancels.forget(job_id)
        self.pending.pop(job_id, None)
        self.gangs.pop(job_id, None)
        self.reasons.forget(job_id)
        self.resume.pop(job_id, None)
        self.resume_step.pop(job_id, None)
        self.excluded.pop(job_id, None)
        self.specs.pop(job_id, None)
        self.attained.pop(job_id, None)
        self.expected.pop(job_id, None)
        self.finished.add(job_id)

    def _spares(self, spec: JobSpec) -> int:
        return spares(spec, self.spare_ratio)

    def _pending(
        self, spec: JobSpec, ready_at: datetime, *, not_before: datetime | None = None, excluded: bool = True
    ) -> PendingJob:
        """The job as placement sees it: ``excluded`` (a recovery's nodes to avoid) and its spares, its attained
        service, and its expected run time (declared, else estimated) less what its attempts ran (its expected run
        from a start now)."""
        attained = self.attained.get(spec.job_id, 0.0)
        expected = spec.expected_duration_s
        if expected is None:
            expected = self.estimates.estimate(EstimateKey.of(spec))
        if expected is None:
            self.expected.pop(spec.job_id, None)
        else:
            self.expected[spec.job_id] = expected
        return PendingJob(
            spec,
            ready_at,
            excluded_nodes=self.excluded.get(spec.job_id, frozenset()) if excluded else frozenset(),
            not_before=not_before,
            spares=self._spares(spec) if excluded else 0,
            attained_gpu_s=attained,
            expected_run_s=None if expected is None else max(1.0, expected - attained / max(1, spec.gpu_count)),
        )

    def _on_scheduled(self, event: JobScheduled) -> None:
        """A placement: ours as we make it, then again as it comes back from the log (its echo must not reset the
        gang's started shards), or replayed; judged by term (see ``fencing``). A stale placement changes nothing
        but is revoked; a newer leader's supersedes the job's current one, which is revoked."""
        job_id = event.job_id
        gang = self.gangs.get(job_id)
        if not self.fence.take(event, gang.scheduled if gang is not None else None, ended=job_id in self.finished):
            return
        self.gangs.pop(job_id, None)  # superseded, if there was one
        self.last_port[job_id] = (event.coordinator_node, event.rendezvous_port)
        self.pending.pop(job_id, None)
        spec = self.specs.get(job_id)
        if spec is not None:
            self.gangs[job_id] = Gang(spec, event)

    @property
    def placed(self) -> Mapping[str, tuple[int, int]]:
        """Job -> (term, attempt) of its newest placement read (see ``fencing``)."""
        return self.fence.placed

    def _decided(self, events: list[Event]) -> list[Event]:
        """Take in what this book just decided, as it will read it back from the log: a decision made is not made
        again (a shard failed here is not failed twice; a job ended here is not decided for again)."""
        for event in events:
            self.apply(event)
        return events

    # --- the snapshot ------------------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return self._views.snapshot(self.nodes, self.gangs.values(), self.attained, self.expected)

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
        # 2. Decide for every pending job on one snapshot, and carry the decisions out.
        self.reasons.new_cycle()
        if not self.pending:
            return out
        snapshot = self.snapshot()
        by_id = self._views.views  # the snapshot's views, by node id
        # Spares follow the ratio in force now, not the one when the job became ready.
        queue = [replace(job, spares=self._spares(job.spec)) for job in self.pending.values()]
        for decision in schedule(snapshot, queue, self.policy, now=now, index=self._views.index):
            try:
                out.extend(self._carry_out(decision, by_id, now))
            except Exception as exc:  # one job's bad data fails that job, never the cycle
                if not isinstance(decision, Preempt):  # a victim is a placed job: its preemption is just not made
                    out.extend(self._invalid(Invalid(decision.job_id, f"{type(exc).__name__}: {exc}"[:500]), now))
        return out

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
        )
        self.apply(scheduled)
        self.reasons.forget(place.job_id)
        return [scheduled, *assignments]

    def _free_port(self, view: NodeView, job_id: str) -> int | None:
        return free_port(view, self.gangs.values(), self.last_port.get(job_id))

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
        before = self.snapshot()  # the failed gang's GPUs still count as taken: replacements go elsewhere
        self.apply(plan)
        if plan.retry_at > now:
            return out
        views = {view.node_id: view for view in self.snapshot().nodes}
        ground = Ground(self.nodes, before, views, lambda view: self._free_port(view, plan.job_id), self.policy)
        reformed = reform(gang, frozenset(self.excluded.get(plan.job_id, ())), ground, now)
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
