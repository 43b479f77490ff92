"""The scheduler's state (rebuilt from the log) and its decisions, as events to publish. Pure: time comes in.

``apply`` takes facts (also during the start-up replay) and never decides; ``cycle``, ``on_shard_event`` and
``on_cancel`` return the events that carry out decisions. The book decides under ``term``, the term its replica was
elected under (``take_over``); the terms it reads are a fence (see ``fencing``), never its own.
"""

import math
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta

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
    JobUnschedulable,
    NodeState,
    PendingReason,
    RedundancyChanged,
    ShardAssignment,
    ShardCheckpointed,
    ShardCompleted,
    ShardFailed,
    ShardPlacement,
    ShardPreempted,
    ShardStarted,
    ShardStopRequest,
    Workload,
)
from shardyard.placement.cycle import schedule
from shardyard.placement.model import (
    Invalid,
    NodeView,
    PendingJob,
    Place,
    Policy,
    Preempt,
    Snapshot,
    Unschedulable,
)
from shardyard.placement.snapshot import SnapshotCache
from shardyard.scheduler.elasticity import ElasticityTracker
from shardyard.scheduler.fencing import Verdict, judge, stale_revocations
from shardyard.scheduler.gang import Gang, revocation
from shardyard.scheduler.orphans import ShardKey, orphan_failure, orphaned, running_keys
from shardyard.scheduler.start_deadline import overdue, start_timeout
from shardyard.topology import estimated_rtt_ms

MAX_SHARDS = 1 << 20
"""Beyond any shard count admission accepts (4096): a larger one gets no spares (its job fails in the cycle)."""
ORPHAN_CHECK_EVERY_S = 1.0
"""Orphans are looked for at most this often (a check reads every placed shard; cycles come per batch of facts)."""


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
        self.attempts: dict[str, int] = {}
        """Job -> the attempt of its newest placement in force (or ended)."""
        self.placed: dict[str, tuple[int, int]] = {}
        """Job -> (term, attempt) of its newest placement: the fence placements are judged by (see ``fencing``)."""
        self.numbered: dict[str, int] = {}
        """Job -> the highest attempt seen placed, stale placements included: its next placement takes a higher one."""
        self.stale: list[JobScheduled] = []
        """Fenced or superseded placements whose shards the leader has yet to revoke."""
        self._orphans_checked_at: datetime | None = None
        self.finished: set[str] = set()
        self.reasons: dict[str, tuple[str, str]] = {}
        self.blocked: list[tuple[JobSpec, PendingReason, datetime]] = []
        """(spec, reason, ready since) of each job the last cycle could not place."""
        self.cancel_requested: dict[str, str] = {}
        """Cancel requests for jobs not yet ready here (held by the queue, or in flight): job -> requested by."""

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
                gang = self.gangs.get(event.job_id)
                if gang is not None and gang.scheduled.attempt > event.attempt:
                    return  # a plan for an attempt already replaced
                self.gangs.pop(event.job_id, None)
                self.excluded[event.job_id] = self.excluded.get(event.job_id, frozenset()) | set(event.exclude_nodes)
                spec = self.specs.get(event.job_id)
                if spec is not None:
                    self.pending[event.job_id] = self._pending(spec, event.occurred_at, not_before=event.retry_at)
            case JobScheduled():
                self._on_scheduled(event)
            case JobRunning() if event.job_id in self.gangs:
                self.gangs[event.job_id].running = True
            case JobPreempting() if self._current(event.job_id, event.attempt):
                gang = self.gangs[event.job_id]
                gang.preempted_by = event.by_job
                gang.preempt_deadline = event.occurred_at + timedelta(seconds=event.deadline_s)
            case JobPreempted() if event.job_id not in self.finished:
                ended = self.gangs.pop(event.job_id, None)
                spec = ended.spec if ended is not None else self.specs.get(event.job_id)
                if event.checkpoint_dir:
                    self.resume[event.job_id] = event.checkpoint_dir
                if spec is not None:
                    self.pending[event.job_id] = PendingJob(spec, event.occurred_at)
            case JobCancelRequested() if event.job_id not in self.finished:
                self.cancel_requested[event.job_id] = event.requested_by
            case JobSucceeded() | JobFailed() | JobCancelled():
                self.cancel_requested.pop(event.job_id, None)
                self.pending.pop(event.job_id, None)
                self.gangs.pop(event.job_id, None)
                self.reasons.pop(event.job_id, None)
                self.resume.pop(event.job_id, None)
                self.resume_step.pop(event.job_id, None)
                self.excluded.pop(event.job_id, None)
                self.specs.pop(event.job_id, None)
                self.finished.add(event.job_id)
            case ShardStarted() if self._current(event.job_id, event.attempt):
                gang = self.gangs[event.job_id]
                if event.shard_index not in gang.failed:  # a start after the start deadline's failure is too late
                    gang.started.add(event.shard_index)
            case ShardFailed() if self._current(event.job_id, event.attempt):
                self.gangs[event.job_id].failed.add(event.shard_index)
            case ShardCompleted() if self._current(event.job_id, event.attempt):
                self.gangs[event.job_id].completed[event.shard_index] = event
            case ShardPreempted() if self._current(event.job_id, event.attempt):
                self.gangs[event.job_id].preempted[event.shard_index] = event
            case _:
                pass

    def _spares(self, spec: JobSpec) -> int:
        if self.spare_ratio <= 0 or not 0 < spec.shard_count <= MAX_SHARDS:
            return 0  # a shard count no admission accepts fails the job in the cycle, not here
        return math.ceil(spec.shard_count * self.spare_ratio - 1e-9)

    def _pending(self, spec: JobSpec, ready_at: datetime, *, not_before: datetime | None = None) -> PendingJob:
        excluded = self.excluded.get(spec.job_id, frozenset())
        return PendingJob(spec, ready_at, excluded_nodes=excluded, not_before=not_before, spares=self._spares(spec))

    def _on_scheduled(self, event: JobScheduled) -> None:
        """A placement: ours as we make it, then again as it comes back from the log (its echo must not reset the
        gang's started shards), or replayed; judged by term (see ``fencing``). A stale placement changes nothing
        but is revoked; a newer leader's supersedes the job's current one, which is revoked."""
        job_id = event.job_id
        self.numbered[job_id] = max(self.numbered.get(job_id, 0), event.attempt)
        if job_id in self.finished:
            return
        gang = self.gangs.get(job_id)
        verdict = judge(event, self.placed.get(job_id), gang.scheduled if gang is not None else None)
        if verdict is Verdict.STALE:
            self.stale.append(event)
            return
        if verdict is not Verdict.NEW:
            return  # the echo of our own placement, or that attempt already ended (the job was requeued)
        if gang is not None:
            self.stale.append(gang.scheduled)  # superseded by a newer leader's placement of the job
            self.gangs.pop(job_id)
        self.placed[job_id] = (event.term, event.attempt)
        self.attempts[job_id] = event.attempt
        self.last_port[job_id] = (event.coordinator_node, event.rendezvous_port)
        self.pending.pop(job_id, None)
        spec = self.specs.get(job_id)
        if spec is not None:
            self.gangs[job_id] = Gang(spec, event)

    def _current(self, job_id: str, attempt: int) -> bool:
        gang = self.gangs.get(job_id)
        return gang is not None and gang.scheduled.attempt == attempt

    # --- the snapshot ------------------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return self._views.snapshot(self.nodes, self.gangs.values())

    # --- decisions ---------------------------------------------------------------------------------------------
    def cycle(self, now: datetime) -> list[Event]:
        """One scheduling cycle: fenced placements are revoked, overdue preemptions end, cancelled jobs leave,
        shards past their start deadline and orphaned shards are revoked and failed, every pending job is decided
        (a job that cannot be decided for fails, alone)."""
        out = self._revoke_stale(now)
        out.extend(self._overdue_preemptions(now))
        for job_id in [j for j in [*self.pending, *self.gangs] if j in self.cancel_requested]:
            # A cancel request that arrived before the job became ready here (e.g. as the queue released it), or
            # one a previous leader took in but did not carry out.
            request = JobCancelRequested(occurred_at=now, job_id=job_id, requested_by=self.cancel_requested[job_id])
            out.extend(self.on_cancel(request, now))
        out.extend(self._overdue_starts(now))
        out.extend(self._orphans(now))
        self.blocked = []
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
        pending = self.pending[decision.job_id]
        self.blocked.append((pending.spec, decision.reason, pending.ready_at))
        return self._explain(decision, now)

    def _invalid(self, decision: Invalid, now: datetime) -> list[Event]:
        """End a job no cycle can decide for: FAILED ``INVALID_SPEC``, with what broke."""
        if decision.job_id in self.finished:
            return []
        failed = JobFailed(
            occurred_at=now,
            job_id=decision.job_id,
            attempt=self.attempts.get(decision.job_id, 0),
            cause=FailureCause.INVALID_SPEC,
            message=decision.message,
        )
        self.apply(failed)
        return [failed]

    def _revoke_stale(self, now: datetime) -> list[Event]:
        """Revoke what fenced and superseded placements assigned (see ``fencing``), under this book's term."""
        stale, self.stale = self.stale, []
        out: list[Event] = []
        for placement in stale:
            gang = self.gangs.get(placement.job_id)
            out.extend(stale_revocations(placement, gang.scheduled if gang else None, term=self.term, now=now))
        return out

    def _orphans(self, now: datetime) -> list[Event]:
        """Revoke the shards no node reports running past their start deadline and the grace, and report them failed
        ``ORPHANED`` (see ``orphans``); the failure, applied here, marks each one decided."""
        last = self._orphans_checked_at
        if last is not None and (now - last).total_seconds() < ORPHAN_CHECK_EVERY_S:
            return []
        self._orphans_checked_at = now
        out: list[Event] = []
        grace = self.reservation_grace_s
        for gang in list(self.gangs.values()):
            found = orphaned(gang, self.nodes, self.running, now, deadline_s=self.start_deadline_s, grace_s=grace)
            for shard in found:
                events = orphan_failure(gang, shard, term=self.term, grace_s=grace, now=now)
                for event in events:
                    self.apply(event)
                out.extend(events)
        return out

    def _short_of_spares(self, place: Place, now: datetime) -> bool:
        """A first placement missing some of its spares waits up to ``spare_grace_s`` for them (agents report a new
        job's artifacts within a fraction of a second, one after another); then the gang goes without."""
        job = self.pending[place.job_id]
        wanted = self._spares(job.spec)
        placed = sum(1 for p in place.placements if p.spare)
        if placed >= wanted or self.attempts.get(place.job_id, 0) > 0:
            return False
        return (now - job.ready_at).total_seconds() < self.spare_grace_s

    def elasticity_signals(self, now: datetime) -> list[Event]:
        """Capacity requests and reclaim candidates from the last cycle's verdicts (called once a tick: O(nodes))."""
        return self.elasticity.observe(self.blocked, self.nodes, self._busy_nodes(), now)

    def _busy_nodes(self) -> set[str]:
        return {shard.node_id for gang in self.gangs.values() for shard in gang.scheduled.placements}

    def _explain(self, decision: Unschedulable, now: datetime) -> list[Event]:
        if self.reasons.get(decision.job_id) == (decision.reason, decision.message):
            return []
        self.reasons[decision.job_id] = (decision.reason, decision.message)
        return [
            JobUnschedulable(
                occurred_at=now,
                job_id=decision.job_id,
                reason=decision.reason,
                message=decision.message,
                node_counts=decision.node_counts,
            )
        ]

    def _admit(self, place: Place, nodes: dict[str, NodeView], now: datetime) -> list[Event]:
        spec = self.pending[place.job_id].spec
        attempt = self.numbered.get(place.job_id, 0) + 1  # never an attempt seen placed, under any term
        coordinator = nodes[place.coordinator_node]
        # The view's ports were free at the snapshot; gangs admitted earlier in this cycle took some of them.
        port = self._free_port(coordinator, place.job_id) or coordinator.rendezvous_ports[-1]
        resume_from = self.resume.get(place.job_id)
        scheduled = JobScheduled(
            occurred_at=now,
            job_id=place.job_id,
            attempt=attempt,
            term=self.term,
            coordinator_node=place.coordinator_node,
            rendezvous_port=port,
            placements=place.placements,
            degraded=place.degraded,
            resume_from=resume_from,
        )
        workload = Workload(
            model_path=spec.model_path,
            dataset_path=spec.dataset_path,
            output_path=f"{self.checkpoint_root}/{spec.job_id}",
            sync_interval=spec.sync_interval,
            max_steps=spec.max_steps,
            batch_size=spec.batch_size,
            seq_len=spec.seq_len,
            lr=spec.lr,
            seed=spec.seed,
            resume_from=resume_from,
            entrypoint=spec.entrypoint,
        )
        assignments = [
            ShardAssignment(
                occurred_at=now,
                job_id=spec.job_id,
                shard_index=shard.shard_index,
                world_size=spec.shard_count,
                node_id=shard.node_id,
                gpu_indices=shard.gpu_indices,
                attempt=attempt,
                term=self.term,
                master_addr=coordinator.address,
                master_port=port,
                workload=workload,
                spare=shard.spare,
            )
            for shard in place.placements
        ]
        self.apply(scheduled)
        self.reasons.pop(place.job_id, None)
        return [scheduled, *assignments]

    def _preempt(self, decision: Preempt, now: datetime) -> list[Event]:
        """Ask every shard of the victim to checkpoint and stop; the gang ends when all have (or at the deadline)."""
        gang = self.gangs.get(decision.job_id)
        if gang is None or gang.preempted_by is not None:
            return []
        attempt = gang.scheduled.attempt
        marker = JobPreempting(
            occurred_at=now,
            job_id=decision.job_id,
            attempt=attempt,
            by_job=decision.by_job,
            deadline_s=self.preempt_deadline_s,
        )
        self.apply(marker)
        requests = [
            ShardStopRequest(
                occurred_at=now,
                job_id=decision.job_id,
                shard_index=shard.shard_index,
                node_id=shard.node_id,
                attempt=attempt,
                term=self.term,
                reason=f"preempted by {decision.by_job}",
            )
            for shard in gang.scheduled.placements
            if shard.shard_index not in gang.completed and not shard.spare
        ]
        return [marker, *requests]

    def _overdue_preemptions(self, now: datetime) -> list[Event]:
        out: list[Event] = []
        for job_id, gang in list(self.gangs.items()):
            if gang.preempt_deadline is not None and now >= gang.preempt_deadline:
                out.extend(self._revoke(gang, now, f"preempted by {gang.preempted_by}: no checkpoint in time"))
                out.extend(self._end_preemption(job_id, gang, now))
        return out

    def _overdue_starts(self, now: datetime) -> list[Event]:
        """Revoke the shards not started by their start deadline and report them failed (see ``start_deadline``);
        the failure, applied here, marks each one decided."""
        out: list[Event] = []
        for gang in self.gangs.values():
            for shard in overdue(gang, now, self.start_deadline_s):
                events = start_timeout(gang, shard, term=self.term, deadline_s=self.start_deadline_s, now=now)
                for event in events:
                    self.apply(event)
                out.extend(events)
        return out

    def _end_preemption(self, job_id: str, gang: Gang, now: datetime) -> list[Event]:
        lead = gang.preempted.get(0) or next(iter(gang.preempted.values()), None)
        checkpoint = lead.checkpoint_dir if lead is not None else None
        event = JobPreempted(
            occurred_at=now,
            job_id=job_id,
            attempt=gang.scheduled.attempt,
            by_job=gang.preempted_by or "",
            checkpoint_dir=checkpoint or self.resume.get(job_id),
            checkpoint_step=lead.step if lead is not None and checkpoint else None,
        )
        self.apply(event)
        return [event]

    def on_shard_event(self, now: datetime, jobs: Iterable[str] | None = None) -> list[Event]:
        """Gang-level consequences of shard facts: all started -> RUNNING; all done -> SUCCEEDED; all stopped on a
        preemption request -> PREEMPTED (requeued). For the gangs of ``jobs`` (those a fact was about), or every
        gang (a new leader carrying out what is due)."""
        out: list[Event] = []
        chosen = self.gangs.items() if jobs is None else [(j, self.gangs[j]) for j in jobs if j in self.gangs]
        for job_id, gang in list(chosen):
            attempt = gang.scheduled.attempt
            count = gang.spec.shard_count
            if not gang.running and len(gang.started) == count:
                gang.running = True
                out.append(JobRunning(occurred_at=now, job_id=job_id, attempt=attempt))
            if len(gang.completed) == count:
                out.extend(self._revoke(gang, now, "job succeeded: spare released"))  # only spares are left
                lead = gang.completed.get(0) or next(iter(gang.completed.values()))
                event = JobSucceeded(
                    occurred_at=now,
                    job_id=job_id,
                    attempt=attempt,
                    final_loss=lead.final_loss,
                    checkpoint_dir=lead.checkpoint_dir,
                )
                self.apply(event)
                out.append(event)
            elif gang.preempted and len(gang.preempted) + len(gang.completed) == count:
                out.extend(self._end_preemption(job_id, gang, now))
        return out

    def on_recovering(self, plan: JobRecovering, now: datetime) -> list[Event]:
        """Carry out the fault manager's plan: stop what is left of the failed attempt and re-form the gang at once
        when no backoff applies, keeping the surviving shards' GPUs (their nodes hold the job's warm standbys and its
        data): the lost shards take the gang's spares when it holds enough off the excluded nodes, else free GPUs
        found for them alone, off the excluded nodes and the gang's own GPUs. The new attempt resumes from the last
        checkpoint without waiting for a placement cycle. When neither works, or a backoff applies, the job is
        requeued and placed afresh."""
        gang = self.gangs.get(plan.job_id)
        if gang is None or gang.scheduled.attempt != plan.attempt or plan.job_id in self.finished:
            self.apply(plan)
            return []
        out: list[Event] = self._revoke(gang, now, f"recovering: {plan.cause}")
        before = self.snapshot()  # the failed gang's GPUs still count as taken: replacements go elsewhere
        self.apply(plan)
        if plan.retry_at > now:
            return out
        excluded = set(self.excluded.get(plan.job_id, ()))
        reformed = self._promote(gang, excluded) or self._replace_lost(gang, excluded, before, now)
        if reformed is not None:
            snapshot = self.snapshot()
            out.extend(self._admit(reformed, {view.node_id: view for view in snapshot.nodes}, now))
        return out

    def _survivors(self, gang: Gang, excluded: set[str]) -> tuple[list[ShardPlacement], list[ShardPlacement], int]:
        """The gang's training shards on usable nodes (ALIVE, not excluded), its usable spares, and how many
        training shards were lost."""

        def usable(shard: ShardPlacement) -> bool:
            node = self.nodes.get(shard.node_id)
            return shard.node_id not in excluded and node is not None and node.status.value == "ALIVE"

        training = [p for p in gang.scheduled.placements if not p.spare]
        spares = [p for p in gang.scheduled.placements if p.spare and usable(p)]
        survivors = [p for p in training if usable(p)]
        return survivors, spares, len(training) - len(survivors)

    def _promote(self, gang: Gang, excluded: set[str]) -> Place | None:
        survivors, spares, lost = self._survivors(gang, excluded)
        if lost == 0 or len(spares) < lost:
            return None
        return self._reform(gang, [*survivors, *spares[:lost]], spares[lost:])

    def _replace_lost(self, gang: Gang, excluded: set[str], snapshot: Snapshot, now: datetime) -> Place | None:
        """The survivors, and the lost shards placed alone on ``snapshot`` (where the failed gang's GPUs are taken)
        as a gang of their own, by the same rules as any placement; the usable spares stay spares. None when they do
        not fit now (no preemption for them: the requeued job competes as usual)."""
        survivors, spares, lost = self._survivors(gang, excluded)
        if lost == 0:
            return self._reform(gang, survivors, spares)
        spec = gang.spec.model_copy(update={"shard_count": lost})
        alone = PendingJob(spec, now, excluded_nodes=frozenset(excluded))
        decisions = schedule(snapshot, [alone], self.policy, now=now)
        found = next((d for d in decisions if isinstance(d, Place) and d.job_id == spec.job_id), None)
        if found is None:
            return None
        return self._reform(gang, [*survivors, *(p for p in found.placements if not p.spare)], spares)

    def _reform(self, gang: Gang, members: list[ShardPlacement], spares: list[ShardPlacement]) -> Place | None:
        """The re-formed gang: ``members`` train (indices 0..), ``spares`` follow; the coordinator is the member with
        the lowest total RTT to the others that has a free rendezvous port."""
        placements = [
            *(p.model_copy(update={"shard_index": i, "spare": False}) for i, p in enumerate(members)),
            *(p.model_copy(update={"shard_index": len(members) + i, "spare": True}) for i, p in enumerate(spares)),
        ]
        self.snapshot()  # brings the views up to date
        views = self._views.views
        hosts = [views[p.node_id] for p in members if p.node_id in views]
        if len(hosts) < len(members):
            return None
        # The coordinator: the member with the lowest total RTT to the others that has a free rendezvous port.
        distinct = list({view.node_id: view for view in hosts}.values())
        ranked = sorted(distinct, key=lambda v: sum(estimated_rtt_ms(v, other, {}) for other in hosts))
        degraded = any(p.degraded for p in placements if not p.spare)
        for view in ranked:
            if self._free_port(view, gang.spec.job_id) is not None:
                return Place(gang.spec.job_id, tuple(placements), view.node_id, degraded)
        return None

    def _free_port(self, view: NodeView, job_id: str) -> int | None:
        """A rendezvous port of ``view`` no gang uses, and not the job's previous one (its old store may linger)."""
        used = {
            g.scheduled.rendezvous_port for g in self.gangs.values() if g.scheduled.coordinator_node == view.node_id
        }
        if self.last_port.get(job_id, ("", 0))[0] == view.node_id:
            used.add(self.last_port[job_id][1])
        return next((p for p in view.rendezvous_ports if p not in used), None)

    def on_cancel(self, request: JobCancelRequested, now: datetime) -> list[Event]:
        """Cancel a job the scheduler holds (pending or placed); the queue cancels jobs still waiting on parents."""
        job_id = request.job_id
        if job_id in self.finished:
            return []
        if job_id not in self.pending and job_id not in self.gangs:
            self.apply(request)  # remembered: carried out if the job becomes ready here
            return []
        gang = self.gangs.get(job_id)
        out: list[Event] = self._revoke(gang, now, f"cancelled by {request.requested_by}") if gang else []
        event = JobCancelled(occurred_at=now, job_id=job_id, message=f"cancelled by {request.requested_by}")
        self.apply(event)
        return [*out, event]

    def revocations(self, failed: JobFailed, now: datetime) -> list[Event]:
        """Stop the shards of a failed job that are still running, so its GPUs are freed at once."""
        gang = self.gangs.get(failed.job_id)
        return self._revoke(gang, now, f"job failed: {failed.cause}") if gang else []

    def _revoke(self, gang: Gang, now: datetime, reason: str) -> list[Event]:
        return [
            revocation(gang, shard, term=self.term, now=now, reason=reason)
            for shard in gang.scheduled.placements
            if shard.shard_index not in gang.completed and shard.shard_index not in gang.preempted
        ]
