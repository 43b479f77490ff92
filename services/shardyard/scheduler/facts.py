"""The scheduler book's state and the facts it takes in (``apply``, also during the start-up replay): jobs ready,
placed, running, preempted, recovering and ended, node states, link measurements, the redundancy ratio. It never
decides here: ``SchedulerBook`` (``book``) adds the decisions on top of this state."""

from collections.abc import Mapping
from datetime import datetime

from shardyard.events import (
    Event,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPreempted,
    JobPreempting,
    JobReady,
    JobRecovering,
    JobResized,
    JobRunning,
    JobScheduled,
    JobSpec,
    JobStraggling,
    JobSucceeded,
    LinkMeasured,
    NodeState,
    NodeStatus,
    QueuesConfigured,
    RedundancyChanged,
    ShardCheckpointed,
    ShardCompleted,
    ShardFailed,
    ShardPreempted,
    ShardStarted,
)
from shardyard.placement.estimates import DurationEstimates, EstimateKey
from shardyard.placement.model import PendingJob, Policy
from shardyard.placement.snapshot import SnapshotCache
from shardyard.scheduler.admission import spares
from shardyard.scheduler.cancellation import CancelRequests
from shardyard.scheduler.elasticity import ElasticityTracker
from shardyard.scheduler.exclusions import DEFAULT_HEAL_S, Exclusions
from shardyard.scheduler.fencing import Fence
from shardyard.scheduler.gang import Gang
from shardyard.scheduler.links import LinkView
from shardyard.scheduler.orphans import OrphanCheck, ShardKey, running_keys
from shardyard.scheduler.reasons import PendingReasons
from shardyard.scheduler.resize import Shrinks
from shardyard.stragglers import health


class BookFacts:
    """What the scheduler knows, rebuilt from the log; see ``SchedulerBook`` for what it decides."""

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
        exclusion_heal_s: float = DEFAULT_HEAL_S,
        unschedulable_after_s: float = 0.0,
        resize_cooldown_s: float = 30.0,
    ) -> None:
        self.term = term
        """The term this book decides under: its replica's, once elected. Never raised by what it reads."""
        self.checkpoint_root = checkpoint_root.rstrip("/")
        self.policy = policy or Policy()
        self.preempt_deadline_s, self.start_deadline_s = preempt_deadline_s, start_deadline_s
        self.reservation_grace_s, self.spare_grace_s = reservation_grace_s, spare_grace_s
        self.unschedulable_after_s = unschedulable_after_s  # NEVER_FITS this long: FAILED UNSCHEDULABLE (0: never)
        self.resize_cooldown_s = resize_cooldown_s  # an elastic gang grows once its attempt is this old
        self.elasticity = elasticity or ElasticityTracker()
        self.nodes: dict[str, NodeState] = {}
        self.running: dict[str, frozenset[ShardKey]] = {}  # node -> the shards its last state reports running
        self._views = SnapshotCache(self.policy)
        """The nodes' views for placement, kept between cycles (rebuilt only where a node or its gangs changed)."""
        self.specs: dict[str, JobSpec] = {}
        self.pending: dict[str, PendingJob] = {}
        self.gangs: dict[str, Gang] = {}
        self.resume: dict[str, str] = {}
        """Job -> checkpoint (job path) its next attempt resumes from."""
        self.resume_step: dict[str, int] = {}
        self.spare_ratio = 0.0  # the fault manager's redundancy ratio: new gangs get ceil(shards x ratio) spares
        self.exclusions = Exclusions(heal_s=exclusion_heal_s)
        """Nodes each job is kept off after a failure there, until the node has been healthy a while."""
        self.avoid: dict[str, frozenset[str]] = {}
        """Job -> nodes its next attempt only avoids (a disk that filled)."""
        self.last_port: dict[str, tuple[str, int]] = {}  # job -> (node, port) of its latest rendezvous: not reused
        self.fence = Fence()
        """The placements read so far, which judge the next ones (see ``fencing``) and number their attempts."""
        self.orphan_check = OrphanCheck()  # looks for orphaned shards, at most once a second (see ``orphans``)
        self.shrinks = Shrinks()  # the shards shrinks gave up, while they stop (see ``resize``)
        self.attained: dict[str, float] = {}
        """Job -> GPU-seconds its ended attempts held GPUs for (its least-attained-service queue)."""
        self.estimates = DurationEstimates()
        """Run times learned from the jobs that succeeded, for the jobs that declare none."""
        self.expected: dict[str, float] = {}
        """Job -> its whole expected run time, declared or estimated when it was last ready (none: unknown)."""
        self.spreads: dict[str, tuple[float, ...]] = {}  # job -> its whole run's spread, as ``expected``
        self.finished: set[str] = set()
        self.reasons = PendingReasons()
        """Why each pending job is not placed: shown when it changes, and the last cycle's verdicts."""
        self.cancels = CancelRequests()  # cancel requests, kept until their job ends (see ``cancellation``)
        self.links = LinkView()
        """The agents' link measurements: the placement's RTTs, and the nodes with slow links."""
        self.queues: QueuesConfigured | None = None
        """The queues configuration in force (the queues topic's latest): quotas, borrowing, fair share, reclaim."""
        self.degraded: dict[str, datetime] = {}  # node -> until when it ranks last: a straggler was swapped off it

    # --- facts -------------------------------------------------------------------------------------------------
    def apply(self, event: object) -> None:
        match event:
            case NodeState():
                self.nodes[event.node_id] = event
                self.exclusions.node(event)
                self.running[event.node_id] = running_keys(event)
                self._views.changed(event.node_id)
                if event.status is NodeStatus.LOST:
                    self.links.forget(event.node_id)
            case LinkMeasured():
                self.links.apply(event)
            case QueuesConfigured():
                self.queues = event
            case JobReady() if event.job_id not in self.finished and event.job_id not in self.gangs:
                self.specs[event.job_id] = event.spec
                self.pending[event.job_id] = self._pending(event.spec, event.occurred_at)
            case RedundancyChanged():
                self.spare_ratio = event.ratio
            case ShardCheckpointed():
                self._checkpointed(event)
            case JobRecovering() if event.job_id not in self.finished:
                self._requeue_recovering(event)
            case JobResized() if event.job_id not in self.finished:
                self._requeue_resized(event)
            case JobStraggling():
                health.note(self.degraded, event)
            case JobScheduled():
                self._on_scheduled(event)
            case JobPreempted() if event.job_id not in self.finished:
                self._requeue_preempted(event)
            case JobCancelRequested() if event.job_id not in self.finished:
                self.cancels.note(event)
            case JobSucceeded():
                self._learn(event.job_id, event.occurred_at)
                self._finish(event.job_id)
            case JobFailed() | JobCancelled():
                self._finish(event.job_id)
            case JobPreempting() | JobRunning() | ShardStarted() | ShardFailed() | ShardCompleted() | ShardPreempted():
                gang = self.gangs.get(event.job_id)
                if gang is not None and gang.scheduled.attempt == event.attempt:  # another attempt's is no news
                    gang.record(event)
            case _:
                pass

    def _checkpointed(self, event: ShardCheckpointed) -> None:
        """The job's newest checkpoint is where its next attempt resumes; its gang's, what preemption would lose."""
        if event.step >= self.resume_step.get(event.job_id, -1):
            self.resume[event.job_id] = event.checkpoint_dir
            self.resume_step[event.job_id] = event.step
        gang = self.gangs.get(event.job_id)
        if gang is not None and gang.scheduled.attempt == event.attempt:
            gang.record(event)

    def _requeue_recovering(self, plan: JobRecovering) -> None:
        """The failed attempt ends: the job waits for its next one, off the plan's excluded nodes (for good) and its
        avoided ones (a disk that filled: for this next attempt only), not before its backoff."""
        gang = self.gangs.get(plan.job_id)
        if gang is not None and gang.scheduled.attempt > plan.attempt:
            return  # a plan for an attempt already replaced
        self._attempt_ended(self.gangs.pop(plan.job_id, None), plan.occurred_at)
        self.exclusions.add(plan.job_id, plan.exclude_nodes, plan.occurred_at)
        self.avoid[plan.job_id] = frozenset(plan.avoid_nodes)
        spec = self.specs.get(plan.job_id)
        if spec is not None:
            self.pending[plan.job_id] = self._pending(spec, plan.occurred_at, not_before=plan.retry_at)

    def _requeue_resized(self, event: JobResized) -> None:
        """The resized attempt ends: the job is pending for the next one, which its scheduler places at once."""
        gang = self.gangs.get(event.job_id)
        if gang is None or gang.scheduled.attempt != event.attempt:
            return  # an attempt already replaced, or a job this replica never saw placed
        self._attempt_ended(self.gangs.pop(event.job_id), event.occurred_at)
        self.shrinks.shrunk(gang, event)
        self.pending[event.job_id] = self._pending(gang.spec, event.occurred_at, excluded=False)

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
            self.attained[job_id] = self.attained.get(job_id, 0.0) + held_s * gang.size

    def _learn(self, job_id: str, at: datetime) -> None:
        """A job succeeded at ``at``: its run time (all its attempts) teaches the estimates. A failed or cancelled
        job's does not: it is not how long such a job runs."""
        gang, spec = self.gangs.get(job_id), self.specs.get(job_id)
        if gang is None or spec is None:
            return  # ended before this replica saw it placed: its run time is not known here
        ran_s = self.attained.get(job_id, 0.0) / max(1, spec.gpu_count)
        ran_s += (at - gang.scheduled.occurred_at).total_seconds()
        self.estimates.observe(EstimateKey.of(spec), ran_s, spec.expected_duration_s)

    def _finish(self, job_id: str) -> None:
        """The job ended: what was kept to run it goes; what numbers and fences its placements stays, so that a late
        placement of it is still judged (see ``fencing``)."""
        self.cancels.forget(job_id)
        self.pending.pop(job_id, None)
        self.gangs.pop(job_id, None)
        self.reasons.forget(job_id)
        self.resume.pop(job_id, None)
        self.resume_step.pop(job_id, None)
        self.exclusions.forget(job_id)
        self.avoid.pop(job_id, None)
        self.specs.pop(job_id, None)
        self.attained.pop(job_id, None)
        self.expected.pop(job_id, None)
        self.spreads.pop(job_id, None)
        self.shrinks.forget(job_id)
        self.finished.add(job_id)

    def kept_off(self, job_id: str, now: datetime) -> frozenset[str]:
        """The nodes ``job_id`` may not use now: its exclusions that have not healed, and its attempt's avoided."""
        return self.exclusions.of(job_id, now) | self.avoid.get(job_id, frozenset())

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
        spread = self.spreads[spec.job_id] = self.estimates.spread(EstimateKey.of(spec), spec.expected_duration_s)
        return PendingJob(
            spec,
            ready_at,
            excluded_nodes=self.kept_off(spec.job_id, ready_at) if excluded else frozenset(),
            not_before=not_before,
            spares=self._spares(spec) if excluded else 0,
            attained_gpu_s=attained,
            expected_run_s=None if expected is None else max(1.0, expected - attained / max(1, spec.gpu_count)),
            run_quantiles=spread,
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
        self.shrinks.placed(event)

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
