"""The queue's state and decisions: which jobs exist, in what state, what a submission becomes, and when a job held
for its dependencies is released, failed or cancelled.

State is rebuilt from the lifecycle topic with ``apply``, which never decides anything (it also replays the log at
start-up). Decisions return the events to publish, and the book applies them to itself at once, so a redelivered or
replayed fact never decides twice:

- ``on_submission``: admit or refuse a submission (accepted jobs are then settled, see below);
- ``on_lifecycle``: a live lifecycle fact; a parent's end settles its children, a cancel request cancels a held job;
- ``reconcile``: when a replica takes jobs over, once it has read the log, settle every one of them the queue holds
  (a crash between a fact and its consequence is repaired here).

The queue owns a job only while it is ACCEPTED or WAITING ("held"); from READY on the scheduler does.

Replicas split the jobs by the submissions partition of their id (``owned``): every replica applies every fact, and
decides only for its jobs. A submission read from another partition than its job's (a producer that did not key it
by ``task_id``) is forwarded there (``forward_to``), so one replica alone decides whether an id is taken.
"""

import json
import logging
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final
from uuid import NAMESPACE_URL, uuid5

from shardyard.admission import Admitted, Policy, admit, named_job, rejection_id
from shardyard.bus.topics import SUBMISSIONS, partition_of
from shardyard.events import (
    Event,
    FailureCause,
    FieldError,
    JobAccepted,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobReady,
    JobRejected,
    JobSpec,
    JobSucceeded,
    JobWaiting,
    PendingReason,
    QueuesConfigured,
    RejectReason,
    UsedSignature,
)
from shardyard.lifecycle import TERMINAL, JobState, LifecycleFact, moves
from shardyard.queue import team_cancel
from shardyard.queue.arrival import submitted_when
from shardyard.queue.auth import Denied, Gate
from shardyard.queue.dependencies import Fail, Hold, Release, find_cycle, verdict
from shardyard.signing import Credentials

log = logging.getLogger(__name__)

HELD: Final = frozenset({JobState.ACCEPTED, JobState.WAITING})
"""The states in which the queue owns a job."""


def verdict_id(source: str) -> str:
    """The event id of the queue's verdict on the submission at ``source``: the same whichever replica gives it. A
    replica thrown out of its group mid-batch (its session expired) may still publish verdicts its successor gives
    too; both carry this id, so they are one answer, delivered twice, and consumers keep the first."""
    return uuid5(NAMESPACE_URL, f"shardyard:verdict:{source}").hex


@dataclass(frozen=True)
class WaitingFor:
    """The pending reason of the last JobWaiting of a WAITING job."""

    reason: PendingReason
    waiting_for: tuple[str, ...]


@dataclass(frozen=True)
class Forward:
    """Send a submission on to the partition of the job it names, whose owner decides it."""

    job_id: str
    partition: int


class QueueBook:
    def __init__(
        self,
        catalogue: Mapping[str, float],
        *,
        owned: frozenset[int] | None = None,
        policy: Policy | None = None,
        credentials: Credentials | None = None,
        env_key: bytes | None = None,
    ) -> None:
        self.catalogue = catalogue
        self.gate = Gate(credentials, env_key)
        """Who may submit (``auth``): every submission without credentials."""
        self.policy = policy or Policy()
        """The operator's limits: allowed job-path prefixes and environment names, submission bounds."""
        self.owned = owned
        """The submissions partitions whose jobs this replica decides; None: all of them (a single queue)."""
        self.states: dict[str, JobState] = {}
        self.sources: set[str] = set()
        self.specs: dict[str, JobSpec] = {}
        """Specs of held jobs (a released job's spec travels on its JobReady)."""
        self.parents: dict[str, tuple[str, ...]] = {}
        self.children: dict[str, list[str]] = {}
        self.waiting: dict[str, WaitingFor] = {}
        self.cancel_requests: dict[str, str] = {}
        self.queue_of: dict[str, str] = {}
        """Every unfinished job's queue: whose team may cancel it (``team_cancel``)."""
        """Held job -> who asked to cancel it."""
        self._cancel_request_ids: set[str] = set()
        self._waiting_ids: dict[str, set[str]] = {}
        """WAITING job -> ids of the JobWaiting events applied: a re-read or echoed older one must not win."""
        self.queues: QueuesConfigured | None = None
        """The queues configuration in force (the queues topic's latest); None: one queue, no quotas."""

    # --- state ----------------------------------------------------------------------------------------------------
    def apply(self, event: LifecycleFact) -> None:
        """A fact from the lifecycle topic (including the queue's own earlier output). Never decides anything."""
        if isinstance(event, JobAccepted | JobRejected):
            self.sources.add(event.source_offset)
        if isinstance(event, JobAccepted | JobRejected | JobCancelRequested) and event.signature is not None:
            self.gate.replays.remember(event.signature.nonce, event.signature.expires_s)
        if isinstance(event, JobCancelRequested):
            self._note_cancel_request(event)
            return
        job_id = event.job_id
        target = moves(self.states.get(job_id), event)
        if target is not None:
            self.states[job_id] = target
            if isinstance(event, JobAccepted):
                self._add_job(event.spec)
                self.queue_of[job_id] = event.spec.queue
            if target in TERMINAL:
                self.queue_of.pop(job_id, None)
            if target not in HELD:
                self.specs.pop(job_id, None)
                self.waiting.pop(job_id, None)
                self._waiting_ids.pop(job_id, None)
                self.cancel_requests.pop(job_id, None)
        if isinstance(event, JobWaiting) and self.states.get(job_id) is JobState.WAITING:
            seen = self._waiting_ids.setdefault(job_id, set())
            if event.event_id not in seen:
                seen.add(event.event_id)
                self.waiting[job_id] = WaitingFor(event.reason, event.waiting_for)

    def _add_job(self, spec: JobSpec) -> None:
        self.specs[spec.job_id] = spec
        self.parents[spec.job_id] = spec.depends_on
        for parent in spec.depends_on:
            siblings = self.children.setdefault(parent, [])
            if spec.job_id not in siblings:
                siblings.append(spec.job_id)

    def _note_cancel_request(self, event: JobCancelRequested) -> None:
        # A request counts once (the live consumer re-reads the log after the replay), and only for a job that
        # existed, unfinished, when it was made: a request made before a job was submitted cancels nothing.
        if event.event_id in self._cancel_request_ids:
            return
        self._cancel_request_ids.add(event.event_id)
        if self.states.get(event.job_id) in HELD:
            self.cancel_requests[event.job_id] = event.requested_by

    def owns(self, job_id: str) -> bool:
        return self.owned is None or partition_of(job_id, SUBMISSIONS) in self.owned

    # --- decisions ------------------------------------------------------------------------------------------------
    def forward_to(self, raw: bytes, *, source: str, partition: int) -> Forward | None:
        """Where a submission read from submissions ``partition`` must go instead, or None to decide it here: a
        submission naming a job of another partition goes to that one (one replica decides everything about a job
        id). Bytes that name no job are rejected wherever they are read; a decided ``source`` is a no-op anywhere."""
        if source in self.sources:
            return None
        job_id = named_job(raw, self.policy.limits)
        if job_id is None or (target := partition_of(job_id, SUBMISSIONS)) == partition:
            return None
        return Forward(job_id, target)

    def on_submission(
        self,
        raw: bytes,
        *,
        source: str,
        now: datetime,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        appended_at: datetime | None = None,
    ) -> list[Event]:
        """Admit or refuse one submission, signed in its ``headers`` where the cluster has credentials (``auth``).
        ``source`` (topic/partition/offset) makes redelivery a no-op. A rejection is filed under the job the bytes
        or the message ``key`` name (``rejection_id``). An admitted job was submitted when its record reached the log
        (``appended_at``, see ``submitted_when``), not when this replica read it."""
        if source in self.sources:
            return []
        target = team_cancel.cancel_target(raw)
        if target is not None:
            return self._team_cancel(target, raw, headers, source, now)
        anonymous = "invalid-" + source.rsplit("/", 2)[-2] + "-" + source.rsplit("/", 1)[-1]
        fallback_id = rejection_id(raw, key, anonymous, self.policy.limits)
        signed = self.gate.check(raw, headers, now.timestamp())
        if isinstance(signed, Denied):
            return self._reject(fallback_id, signed.reason, signed.message, source, now)
        submitted_at = submitted_when(appended_at, now)
        result = admit(
            raw, catalogue=self.catalogue, submitted_at=submitted_at, fallback_id=fallback_id, policy=self.policy
        )
        if not isinstance(result, Admitted):
            return self._reject(result.job_id, result.reason, result.message, source, now, result.errors)
        spent = None if signed is None else UsedSignature.of(signed)
        spec = result.spec
        denied = self.gate.admits(signed, spec.queue)
        if denied is not None:
            return self._reject(spec.job_id, denied.reason, denied.message, source, now, signature=spent)
        spec_or_denied = self.gate.env_for_agents(spec, signed)
        if isinstance(spec_or_denied, Denied):
            return self._reject(
                spec.job_id, spec_or_denied.reason, spec_or_denied.message, source, now, signature=spent
            )
        spec = spec_or_denied
        refusal = self._refusal(spec, source=source, now=now) or self._quota_refusal(spec, source=source, now=now)
        if refusal is not None:
            refusal = refusal.model_copy(update={"event_id": verdict_id(source), "signature": spent})
            self.apply(refusal)
            return [refusal]
        accepted = JobAccepted(
            event_id=verdict_id(source),
            occurred_at=now,
            job_id=spec.job_id,
            spec=spec,
            source_offset=source,
            signature=spent,
        )
        self.apply(accepted)
        return [accepted, *self._settle([spec.job_id], now)]

    def _team_cancel(
        self, job_id: str, raw: bytes, headers: Sequence[tuple[str, bytes]] | None, source: str, now: datetime
    ) -> list[Event]:
        """A team's signed cancel of its own job (``team_cancel``): the request, or nothing (refused, logged)."""
        signed = self.gate.check(raw, headers, now.timestamp())
        queue = self.queue_of.get(job_id)
        decided = team_cancel.decide(self.gate, signed, job_id, queue, event_id=verdict_id(source), now=now)
        if isinstance(decided, Denied):
            log.warning("cancel of %r at %s refused (%s): %s", job_id, source, decided.reason, decided.message)
            return []
        self.apply(decided)
        return [decided]

    def _reject(
        self,
        job_id: str,
        reason: RejectReason,
        message: str,
        source: str,
        now: datetime,
        errors: tuple[FieldError, ...] = (),
        *,
        signature: UsedSignature | None = None,
    ) -> list[Event]:
        rejection = JobRejected(
            event_id=verdict_id(source),
            occurred_at=now,
            job_id=job_id,
            reason=reason,
            message=message,
            errors=errors,
            source_offset=source,
            signature=signature,
        )
        self.apply(rejection)
        return [rejection]

    def _quota_refusal(self, spec: JobSpec, *, source: str, now: datetime) -> JobRejected | None:
        """Why the queues in force refuse the job: its queue is not one of them, or it asks for more than its queue
        could ever hold (see ``QueuesConfig.never_fits``)."""
        if self.queues is None:
            return None
        config = self.queues.config
        if config.queue(spec.queue) is None:
            names = sorted(config.queues)
            listed = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
            reason, message = RejectReason.UNKNOWN_QUEUE, f"queue {spec.queue!r} is not one of the cluster's: {listed}"
        else:
            model = spec.gpu_model if spec.min_match is None else None  # degraded placement may use another model
            why = config.never_fits(spec.queue, spec.gpu_count, model, spec.cpu_cores, spec.memory_bytes)
            if why is None:
                return None
            reason, message = RejectReason.QUOTA_NEVER_FITS, f"the job could never run in its queue: {why}"
        error = FieldError(field="queue", problem=reason.value.lower().replace("_", " "), input=spec.queue)
        return JobRejected(
            occurred_at=now, job_id=spec.job_id, reason=reason, message=message, errors=(error,), source_offset=source
        )

    def _refusal(self, spec: JobSpec, *, source: str, now: datetime) -> JobRejected | None:
        """Why an otherwise valid submission cannot be accepted: its id is taken, or its dependencies are unusable."""
        current = self.states.get(spec.job_id)
        if current is not None and current is not JobState.REJECTED:
            return JobRejected(
                occurred_at=now,
                job_id=spec.job_id,
                reason=RejectReason.DUPLICATE_JOB,
                message=f"a job named {spec.job_id!r} already exists (state {current}); submit under a new task_id",
                source_offset=source,
            )
        unknown = [p for p in spec.depends_on if self.states.get(p) in (None, JobState.REJECTED)]
        if unknown:
            named = ", ".join(repr(p) for p in unknown)
            return JobRejected(
                occurred_at=now,
                job_id=spec.job_id,
                reason=RejectReason.UNKNOWN_DEPENDENCY,
                message=f"depends_on names jobs the queue does not know or that were rejected: {named}; "
                "submit the parent jobs first",
                errors=(FieldError(field="depends_on", problem=f"unknown jobs: {named}", input=json.dumps(unknown)),),
                source_offset=source,
            )
        cycle = find_cycle(spec.job_id, lambda j: spec.depends_on if j == spec.job_id else self.parents.get(j, ()))
        if cycle is not None:
            path = " -> ".join(cycle)
            return JobRejected(
                occurred_at=now,
                job_id=spec.job_id,
                reason=RejectReason.DEPENDENCY_CYCLE,
                message=f"depends_on makes a dependency cycle: {path}",
                errors=(FieldError(field="depends_on", problem=f"cycle: {path}", input=json.dumps(spec.depends_on)),),
                source_offset=source,
            )
        return None

    def on_lifecycle(self, event: LifecycleFact, now: datetime) -> list[LifecycleFact]:
        """Apply a live lifecycle fact, then decide what follows from it: a parent's end settles its held children,
        a cancel request cancels a held job. Replayed and duplicated facts decide nothing new."""
        self.apply(event)
        if isinstance(event, JobCancelRequested):
            return self._settle([event.job_id], now)
        if isinstance(event, JobSucceeded | JobFailed | JobCancelled):
            return self._settle(self.children.get(event.job_id, ()), now)
        return []

    def reconcile(self, now: datetime) -> list[LifecycleFact]:
        """When this replica takes jobs over (it started, or the group gave it partitions) and has read the log: settle
        every held job it owns (release, wait, fail or cancel as its facts say)."""
        return self._settle(sorted(job for job, state in self.states.items() if state in HELD), now)

    def _settle(self, jobs: Iterable[str], now: datetime) -> list[LifecycleFact]:
        """Decide each held job in ``jobs``; a job that ends here settles its own children in turn."""
        out: list[LifecycleFact] = []
        work = deque(jobs)
        while work:
            job_id = work.popleft()
            event = self._decide(job_id, now)
            if event is None:
                continue
            self.apply(event)
            out.append(event)
            if self.states[job_id] in TERMINAL:
                work.extend(self.children.get(job_id, ()))
        return out

    def _decide(self, job_id: str, now: datetime) -> LifecycleFact | None:
        """The one event that moves a held job on, or None when it is where it should be."""
        state = self.states.get(job_id)
        if state is None or state not in HELD or not self.owns(job_id):
            return None
        if job_id in self.cancel_requests:
            return JobCancelled(
                occurred_at=now,
                job_id=job_id,
                message=f"cancelled by {self.cancel_requests[job_id]} while {state.lower()}, before it was ready",
            )
        spec = self.specs.get(job_id)
        if spec is None:  # held without an acceptance: only a hand-written log gets here
            return None
        match verdict(spec, {parent: self.states.get(parent) for parent in spec.depends_on}):
            case Release():
                return JobReady(occurred_at=now, job_id=job_id, spec=spec)
            case Fail(message=message):
                return JobFailed(
                    occurred_at=now, job_id=job_id, attempt=0, cause=FailureCause.DEPENDENCY_FAILED, message=message
                )
            case Hold(reason=reason, waiting_for=waiting_for, message=message):
                if state is JobState.WAITING and self.waiting.get(job_id) == WaitingFor(reason, waiting_for):
                    return None
                return JobWaiting(
                    occurred_at=now, job_id=job_id, reason=reason, message=message, waiting_for=waiting_for
                )
