"""Job records folded from the lifecycle topic. Pure: events in, ``JobRecord`` rows out; no clock, no database.

A job is accounted from its acceptance (a rejected submission is answered, not run, and has no record). The
transition table (``shardyard.lifecycle``) decides which facts count, as it does for every other consumer: a late or
duplicated event, or a placement under an older scheduler term than the job's newest, changes nothing. So the same
log, read once or twice, in one process or two, gives the same records, each with the same revision.

Each placement (``job.scheduled``) opens an attempt; the move back to READY (``job.recovering``,
``job.preempted``) or the job's end closes it. GPU-hours and run time add up the attempts that closed.

Each record of an ended job carries its goodput ledger (``shardyard.goodput``): its lifecycle facts and its shards'
steps and failures (the shard topic, :meth:`AccountingBook.on_shard`) are kept as a few marks per attempt, and the
ledger is computed from them when the record is taken. A shard's report read after its job's end (the two topics are
read side by side) changes the record again, with the same revision.

A row of an unended job the log no longer holds (:func:`stranded`) is ended ``BROKER_LOG_LOST`` once the log was
read whole: ``shardyard history`` never shows a job READY for ever.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from shardyard.events import (
    FailureCause,
    JobAccepted,
    JobCancelled,
    JobFailed,
    JobPreempted,
    JobRecovering,
    JobResized,
    JobScheduled,
    JobSpec,
    JobSucceeded,
    ShardEvent,
    ShardFailed,
    ShardProgress,
)
from shardyard.goodput import GoodputFold
from shardyard.jobdb.record import LEDGER_COLUMNS, JobRecord
from shardyard.lifecycle import TERMINAL, JobState, LifecycleFact, moves

SECONDS_PER_HOUR = 3600.0


@dataclass
class Attempt:
    number: int
    gpus: int
    """Training GPUs of the gang (its spares left out)."""
    models: tuple[str, ...]
    placed_at: datetime
    closed_at: datetime | None = None

    @property
    def held_s(self) -> float:
        return 0.0 if self.closed_at is None else max(0.0, (self.closed_at - self.placed_at).total_seconds())


@dataclass
class JobFold:
    """One job's facts so far, as the record needs them."""

    spec: JobSpec
    state: JobState = JobState.ACCEPTED
    placed_term: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    ended_at: datetime | None = None
    reason: str | None = None
    message: str = ""
    final_loss: float | None = None
    revision: int = 1
    key_id: str | None = None
    """The key its submission was signed with (its acceptance's)."""
    goodput: GoodputFold = field(default_factory=GoodputFold)
    """Its goodput ledger's marks (``shardyard.goodput``), from its lifecycle and its shards' steps and failures."""

    def apply(self, event: LifecycleFact) -> bool:
        """Fold one fact; False when it changes nothing (refused by the table, or a fact the record does not keep)."""
        target = moves(self.state, event)
        if target is None:
            return False
        if isinstance(event, JobScheduled):
            if event.term < self.placed_term:
                return False  # a deposed leader's placement, fenced as the scheduler fences it
            self.placed_term = event.term
            self.attempts.append(_attempt(event))
        self.state = target
        if target is JobState.READY or target in TERMINAL:
            self._close_attempt(event.occurred_at)
        match event:
            case JobSucceeded():
                self.final_loss = event.final_loss if _finite(event.final_loss) else None
            case JobFailed():
                self.reason, self.message = event.cause.value, event.message
            case JobCancelled():
                self.message = event.message
            case JobRecovering() | JobPreempted() | JobResized():
                pass  # the attempt closed above; the job waits for its next placement
        if target in TERMINAL:
            self.ended_at = event.occurred_at
        self.revision += 1
        return True

    def _close_attempt(self, at: datetime) -> None:
        if self.attempts and self.attempts[-1].closed_at is None:
            self.attempts[-1].closed_at = at

    def record(self) -> JobRecord:
        spec, attempts = self.spec, self.attempts
        started = attempts[0].placed_at if attempts else None
        began_wait = started or self.ended_at
        models = sorted({model for attempt in attempts for model in attempt.models})
        team, queue = team_and_queue(spec)
        ledger: dict[str, Any] = {}
        if self.ended_at is not None:
            values = self.goodput.ledger(self.ended_at).to_json()
            ledger = {name: values[name] for name in LEDGER_COLUMNS}
        return JobRecord(
            job_id=spec.job_id,
            submitted_at=spec.submitted_at,
            state=self.state,
            gpus=spec.gpu_count,
            gpu_model="+".join(models) if models else spec.gpu_model,
            attempts=len(attempts),
            gpu_hours=sum(a.gpus * a.held_s for a in attempts) / SECONDS_PER_HOUR,
            revision=self.revision,
            team=team,
            queue=queue,
            reason=self.reason,
            message=self.message,
            started_at=started,
            ended_at=self.ended_at,
            wait_s=(began_wait - spec.submitted_at).total_seconds() if began_wait is not None else None,
            run_s=sum(a.held_s for a in attempts) if started is not None and self.ended_at is not None else None,
            owner=spec.owner,
            key_id=self.key_id,
            final_loss=self.final_loss,
            **ledger,
        )


def team_and_queue(spec: JobSpec) -> tuple[str | None, str | None]:
    """The submission's optional ``user`` (the team) and ``queue``, as the spec carries them. The spec has a
    ``queue`` ("default" unless the submission names one) but no ``user`` yet (its ``owner`` is who submitted it, not
    a team): both are read by name, so records fill the team once the spec carries one, and it is None until then."""
    team, queue = getattr(spec, "user", None), getattr(spec, "queue", None)
    return (team if isinstance(team, str) else None, queue if isinstance(queue, str) else None)


def _attempt(event: JobScheduled) -> Attempt:
    training = [p for p in event.placements if not p.spare]
    return Attempt(
        number=event.attempt,
        gpus=sum(len(p.gpu_indices) for p in training),
        models=tuple(sorted({p.gpu_model for p in training})),
        placed_at=event.occurred_at,
    )


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


class AccountingBook:
    """Every job's fold, and which records changed since they were last taken."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobFold] = {}
        self._early: dict[str, GoodputFold] = {}
        """The ledgers of jobs whose shards' events came before their acceptance (the two topics are read side by
        side, and from their beginning on every start), until it comes."""
        self._changed: dict[str, None] = {}  # insertion-ordered set

    def apply(self, event: LifecycleFact) -> None:
        """A fact of the lifecycle topic."""
        if isinstance(event, JobAccepted):
            if event.job_id not in self.jobs:  # else the same acceptance again, or one the queue would refuse
                key_id = event.signature.key_id if event.signature is not None else None
                goodput = self._early.pop(event.job_id, None) or GoodputFold()
                goodput.apply(event)
                self.jobs[event.job_id] = JobFold(spec=event.spec, key_id=key_id, goodput=goodput)
                self._changed[event.job_id] = None
            return
        fold = self.jobs.get(event.job_id)
        if fold is None:
            return
        fold.goodput.apply(event)  # it moves with the record (the same table), and takes the preemption notice
        if fold.apply(event):
            self._changed[event.job_id] = None

    def on_shard(self, event: ShardEvent) -> None:
        """An event of the shard topic: a step or a failure goes to its job's ledger. The record changes only once
        the job ended (a running job's ledger is not written), with a shard's report that comes after its end."""
        if not isinstance(event, ShardProgress | ShardFailed):
            return
        fold = self.jobs.get(event.job_id)
        if fold is None:
            self._early.setdefault(event.job_id, GoodputFold()).on_shard(event)
        elif fold.goodput.on_shard(event) and fold.ended_at is not None:
            self._changed[event.job_id] = None

    def take_changed(self) -> list[JobRecord]:
        """The records that changed since the last call, each once, in the order they first changed."""
        records = [self.jobs[job_id].record() for job_id in self._changed]
        self._changed.clear()
        return records

    def changed_again(self, records: list[JobRecord]) -> None:
        """Records that could not be written: taken again with the next changes (as they are then)."""
        for record in records:
            self._changed.setdefault(record.job_id, None)

    @property
    def pending(self) -> int:
        return len(self._changed)


def stranded(kept: Iterable[JobRecord], book: AccountingBook, before: datetime, now: datetime) -> list[JobRecord]:
    """The records of ``kept`` (the database's unended rows) of jobs the log does not hold, ended: the broker lost the
    log that held them (an embedded broker's restart, a cluster started afresh), so no service knows them and none
    would ever end them. Only jobs accepted ``before`` (the log was read whole from then on) are judged: a newer row
    may come from a replica that read further than this one."""
    known = {(job_id, fold.spec.submitted_at) for job_id, fold in book.jobs.items()}
    ended: list[JobRecord] = []
    for record in kept:
        if record.state in TERMINAL or record.submitted_at >= before or (record.job_id, record.submitted_at) in known:
            continue
        ended.append(
            replace(
                record,
                state=JobState.FAILED,
                reason=FailureCause.BROKER_LOG_LOST.value,
                message=f"the broker lost the log that held this job while it was {record.state.value}: nothing is "
                "left to run or end it; submit it again",
                ended_at=now,
                revision=record.revision + 1,
            )
        )
    return ended
