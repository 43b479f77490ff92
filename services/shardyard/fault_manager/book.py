"""The fault manager's view of running gangs and their failures, and its decisions. Pure: time comes in.

``apply`` takes facts (live, and during the start-up replay, in any order across topics) and never decides;
``decide(now)`` returns what came due: a recovery plan (``JobRecovering``) for each failed attempt, or the job's end
(``JobFailed``) when a cause is fatal or the retry budget is spent.

Deciding is gated on attempt numbers: once an attempt is decided (a ``JobRecovering`` or ``JobFailed`` of ours, seen
live or replayed), stopped on purpose (preemption) or superseded by a newer placement, nothing about it is decided
again, so redelivered and replayed facts are harmless.

Placements are fenced by the scheduler's leader term, job by job (as the scheduler fences them, see
``shardyard.scheduler.fencing``): one under a lower term than the newest read for the job is a deposed leader's,
landing late, and places nothing; one under a higher term starts the job's gang afresh, whatever its attempt number.
"""

from dataclasses import dataclass, field
from datetime import datetime

from shardyard.bus.topics import SHARD_EVENTS, partition_of
from shardyard.events import (
    Event,
    FailureCause,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPreempted,
    JobPreempting,
    JobRecovering,
    JobResized,
    JobScheduled,
    JobSucceeded,
    NodeLost,
    NodeState,
    NodeStatus,
    ShardAssignment,
    ShardCause,
    ShardCompleted,
    ShardFailed,
    ShardPreempted,
)
from shardyard.fault_manager.recovery import (
    BAD_NODE,
    Disposition,
    FailedAttempt,
    RetryPolicy,
    disposition,
    exclusions,
    full_disks,
    is_due,
    outcome,
)
from shardyard.fault_manager.stragglers import GangView, StragglerWatch


@dataclass
class Gang:
    """The current attempt's placement."""

    attempt: int
    since: datetime
    """When the attempt was placed (its earliest placement fact)."""
    term: int = 0
    """The scheduler leader term it was placed under."""
    shards: dict[int, str] = field(default_factory=dict)
    """training shard -> node"""
    spares: dict[int, str] = field(default_factory=dict)
    """spare slot -> node: held for the gang, training nothing"""
    stopped: set[int] = field(default_factory=set)
    """training shards that completed or stopped on request"""

    def nodes(self) -> set[str]:
        return set(self.shards.values()) | set(self.spares.values())


@dataclass
class OpenFailure:
    """Failures of one attempt, not decided yet."""

    attempt: int
    first_at: datetime
    causes: dict[int, ShardCause] = field(default_factory=dict)
    """shard -> its first reported cause, in arrival order"""


@dataclass
class JobRecord:
    gang: Gang | None = None
    closed_through: int = 0
    """Attempts up to this one are decided (or stopped on purpose): nothing about them is decided again."""
    retries_used: int = 0
    history: dict[int, tuple[ShardCause, ...]] = field(default_factory=dict)
    """attempt -> the causes its recovery listed"""
    open: OpenFailure | None = None
    fence: int = 0
    """The highest scheduler term of a placement read for the job: placements under lower ones are stale."""
    excluded: set[str] = field(default_factory=set)
    """Nodes its recovery plans excluded (the scheduler keeps the job off them for good)."""
    moves: set[int] = field(default_factory=set)
    """Attempts recovered by a move off a full disk, outside the retry budget."""


@dataclass(frozen=True)
class NodeView:
    status: NodeStatus
    as_of: datetime
    silent_s: float
    disk_free_bytes: int | None = None
    """Free space of its output disk, as its last state said (None: not reported)."""
    draining: bool = False

    def has_room(self, floor: int) -> bool:
        """Whether a job moved off a full disk can go here: ALIVE, not draining, and room reported on its disk."""
        free = self.disk_free_bytes
        return self.status is NodeStatus.ALIVE and not self.draining and free is not None and free >= floor


@dataclass
class FaultBook:
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    nodes: dict[str, NodeView] = field(default_factory=dict)
    _undecided: set[str] = field(default_factory=set)
    """jobs with an open failure"""
    _turned_bad: set[str] = field(default_factory=set)
    """nodes seen SUSPECT or LOST since the last decision"""
    owned: frozenset[int] | None = None
    """The shard-events partitions (keyed by job) whose jobs this replica decides; None: every job (one replica).
    Every replica keeps every job's facts, so that it can take a partition over."""
    stragglers: StragglerWatch = field(default_factory=StragglerWatch)
    """Stragglers found in the running gangs, and the swaps decided for them (``fault_manager.stragglers``)."""

    def owns(self, job_id: str) -> bool:
        return self.owned is None or partition_of(job_id, SHARD_EVENTS) in self.owned

    # -- facts ---------------------------------------------------------------------------------------------------

    def apply(self, event: object) -> None:
        self.stragglers.apply(event)
        match event:
            case JobScheduled():
                for p in event.placements:
                    self._place(
                        event.job_id, event.attempt, event.term, event.occurred_at, p.shard_index, p.node_id, p.spare
                    )
            case ShardAssignment():
                self._place(
                    event.job_id,
                    event.attempt,
                    event.term,
                    event.occurred_at,
                    event.shard_index,
                    event.node_id,
                    event.spare,
                )
            case ShardFailed():
                self._shard_failed(event)
            case ShardCompleted() | ShardPreempted():
                gang = self._gang(event.job_id, event.attempt)
                if gang is not None:
                    gang.stopped.add(event.shard_index)
            case JobRecovering():
                record = self._record(event.job_id)
                if record is not None:
                    record.retries_used = max(record.retries_used, event.retries_used)
                    record.history[event.attempt] = event.causes
                    record.excluded.update(event.exclude_nodes)
                    if not event.counted and event.cause is not FailureCause.STRAGGLER:  # a swap is no disk move
                        record.moves.add(event.attempt)
                    self._close(event.job_id, record, event.attempt)
            case JobPreempting() | JobPreempted() | JobResized():
                # The gang is being stopped on purpose (preempted, or re-formed at another size): its shards' failures
                # (REVOKED, the peers' COMM_ERRORs) are not faults, and its next attempt is placed by the scheduler.
                record = self._record(event.job_id)
                if record is not None:
                    self._close(event.job_id, record, event.attempt)
            case JobSucceeded() | JobFailed() | JobCancelled() | JobCancelRequested():
                # A cancel request ends the job for us too: the failures of its revoked gang are not faults.
                self.ended.add(event.job_id)
                self.jobs.pop(event.job_id, None)
                self._undecided.discard(event.job_id)
            case NodeState():
                silent = (event.occurred_at - event.last_heartbeat_at).total_seconds()
                disk = None if event.output_disk is None else event.output_disk.free_bytes
                self._observe(event.node_id, NodeView(event.status, event.occurred_at, silent, disk, event.draining))
            case NodeLost():
                known = self.nodes.get(event.node_id)
                disk = None if known is None else known.disk_free_bytes
                self._observe(event.node_id, NodeView(NodeStatus.LOST, event.occurred_at, event.silent_for_s, disk))
            case _:
                pass

    def _record(self, job_id: str) -> JobRecord | None:
        if job_id in self.ended:
            return None
        return self.jobs.setdefault(job_id, JobRecord())

    def _gang(self, job_id: str, attempt: int) -> Gang | None:
        record = self.jobs.get(job_id)
        gang = record.gang if record else None
        return gang if gang is not None and gang.attempt == attempt else None

    def _close(self, job_id: str, record: JobRecord, attempt: int) -> None:
        record.closed_through = max(record.closed_through, attempt)
        if record.open is not None and record.open.attempt <= attempt:
            record.open = None
            self._undecided.discard(job_id)

    def _place(self, job_id: str, attempt: int, term: int, at: datetime, index: int, node_id: str, spare: bool) -> None:
        record = self._record(job_id)
        if record is None or attempt <= record.closed_through or term < record.fence:
            return  # the job ended, the attempt is decided, or a deposed leader placed it (fenced by term)
        record.fence = term
        gang = record.gang
        if gang is None or gang.attempt < attempt or gang.term < term:
            gang = record.gang = Gang(attempt, at, term)
            if record.open is not None and record.open.attempt < attempt:
                # Failures of an attempt that was re-placed without us: its outcome is no longer ours to decide.
                record.open = None
                self._undecided.discard(job_id)
        elif gang.attempt > attempt:
            return
        gang.since = min(gang.since, at)
        if spare:
            gang.spares[index] = node_id
            return
        gang.shards[index] = node_id
        view = self.nodes.get(node_id)
        if view is not None and view.status in BAD_NODE and view.as_of >= gang.since:
            self._turned_bad.add(node_id)  # the node's news overtook the placement: check it at the next decision

    def _shard_failed(self, event: ShardFailed) -> None:
        if disposition(event.cause) is Disposition.IGNORE:
            return
        record = self._record(event.job_id)
        if record is None or event.attempt <= record.closed_through:
            return  # the job ended, or the attempt is decided: a redelivery, or a peer's failure after the plan
        if record.gang is not None and record.gang.attempt > event.attempt:
            return  # an attempt already replaced
        cause = ShardCause(
            shard_index=event.shard_index, node_id=event.node_id, cause=event.cause, message=event.message
        )
        self._fail(event.job_id, record, event.attempt, event.occurred_at, [cause])

    def _fail(self, job_id: str, record: JobRecord, attempt: int, at: datetime, causes: list[ShardCause]) -> None:
        if record.open is None or record.open.attempt < attempt:
            record.open = OpenFailure(attempt, at)
        elif record.open.attempt > attempt:
            return
        record.open.first_at = min(record.open.first_at, at)
        for cause in causes:
            record.open.causes.setdefault(cause.shard_index, cause)
        self._undecided.add(job_id)

    def _observe(self, node_id: str, view: NodeView) -> None:
        known = self.nodes.get(node_id)
        if known is not None and view.as_of <= known.as_of:
            return  # older news (a replayed or redelivered state) than what we have
        self.nodes[node_id] = view
        if view.status in BAD_NODE:
            self._turned_bad.add(node_id)
        else:
            self._turned_bad.discard(node_id)

    # -- decisions -----------------------------------------------------------------------------------------------

    def decide(self, now: datetime) -> list[Event]:
        """Every decision due at ``now``: first the gangs hit by a node that went bad, then each failed attempt
        that is due (see ``recovery.is_due``). Each decision is applied before it is returned."""
        self._hit_by_bad_nodes()
        out: list[Event] = []
        for job_id in sorted(self._undecided):
            if not self.owns(job_id):
                continue  # another replica's to decide; its decision comes back as a fact
            record = self.jobs[job_id]
            failure = record.open
            assert failure is not None
            causes = tuple(failure.causes.values())
            gang = record.gang if record.gang is not None and record.gang.attempt == failure.attempt else None
            bad = self._bad_nodes(gang, causes)
            suspects = bad - set(gang.spares.values()) if gang is not None else bad  # a spare trains nothing
            # A training shard that neither failed nor stopped may sit on a dead node, its verdict still to come.
            silent = gang is not None and any(i not in failure.causes and i not in gang.stopped for i in gang.shards)
            if not is_due(causes, suspects, failure.first_at, self.policy, now, silent=silent):
                continue
            decision = outcome(
                FailedAttempt(
                    job_id=job_id,
                    attempt=failure.attempt,
                    causes=causes,
                    bad_nodes=bad,
                    retries_used=record.retries_used,
                    earlier_causes=tuple(c for _, cs in sorted(record.history.items()) for c in cs),
                    room=self._room(record, causes, bad),
                    moves_used=len(record.moves),
                ),
                self.policy,
                now,
            )
            self.apply(decision)
            out.append(decision)
        for swap in self.stragglers.decide(self._running(), now):
            self.apply(swap)
            out.append(swap)
        return out

    def _running(self) -> dict[str, GangView]:
        """The current attempts of the jobs this replica decides, as the straggler watch sees them."""
        return {
            job_id: GangView(
                gang.attempt,
                dict(gang.shards),
                dict(gang.spares),
                record.retries_used,
                max(0, self.policy.max_retries - record.retries_used),
            )
            for job_id, record in self.jobs.items()
            if (gang := record.gang) is not None and gang.attempt > record.closed_through and self.owns(job_id)
        }

    def _hit_by_bad_nodes(self) -> None:
        """A node that went SUSPECT or LOST fails the training shards of the running gangs on it, even if no shard
        reported a failure (a frozen node reports nothing). Only news newer than the gang's placement counts: an
        older bad state is one the placement already outlived."""
        if not self._turned_bad:
            return
        turned, self._turned_bad = self._turned_bad, set()
        for job_id, record in self.jobs.items():
            gang = record.gang
            if gang is None or gang.attempt <= record.closed_through:
                continue
            causes: list[ShardCause] = []
            for index, node_id in sorted(gang.shards.items()):
                view = self.nodes[node_id] if node_id in turned else None
                if view is None or index in gang.stopped or view.as_of < gang.since or view.status not in BAD_NODE:
                    continue
                message = f"node {view.status.value.lower()}: no heartbeat for {view.silent_s:.1f}s"
                causes.append(
                    ShardCause(shard_index=index, node_id=node_id, cause=FailureCause.NODE_LOST, message=message)
                )
            if causes:
                self._fail(job_id, record, gang.attempt, min(self.nodes[c.node_id].as_of for c in causes), causes)

    def _room(self, record: JobRecord, causes: tuple[ShardCause, ...], bad: frozenset[str]) -> tuple[str, ...]:
        """For an attempt that failed DISK_FULL: the nodes a move off the full disk can go to (``NodeView.has_room``),
        off the job's exclusions, this attempt's and the full disks. Not worked out for other failures (it reads
        every node)."""
        full = full_disks(causes)
        if not full:
            return ()
        off = record.excluded | set(exclusions(causes, bad)) | set(full)
        floor = self.policy.disk_floor_bytes
        return tuple(sorted(n for n, view in self.nodes.items() if n not in off and view.has_room(floor)))

    def _bad_nodes(self, gang: Gang | None, causes: tuple[ShardCause, ...]) -> frozenset[str]:
        candidates = (gang.nodes() if gang is not None else set()) | {c.node_id for c in causes}
        return frozenset(n for n in candidates if n in self.nodes and self.nodes[n].status in BAD_NODE)
