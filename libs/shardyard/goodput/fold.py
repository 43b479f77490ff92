"""One job's goodput ledger, folded from its lifecycle facts and its shards' events. Pure: events in, a
:class:`~shardyard.goodput.ledger.Ledger` out; the clock is the ``now`` a reader passes for a job that has not ended.

The facts come from two topics (the lifecycle, and the shards') and carry the clocks of different hosts, so they are
kept as a few marks per attempt (placed, every shard started, notice, closed and why, each shard's first and last
step and when it caught up, first failure) and the ledger is computed from the marks when asked: how the two topics
interleave does not matter (a shard's event may even come before its job's acceptance; each topic's own order is its
log's, the same for every reader), and a shard's time is clamped into its attempt. The lifecycle facts count only
where the transition table (``shardyard.lifecycle``) lets them move the job, and a placement only under the newest
scheduler term, as for every other consumer. Progress reports cost O(1) each: nothing of them is kept but the marks
(a few per shard).

**The walk.** The job's time, from its submission ``A`` to its end ``E`` (its terminal event, or ``now``), is cut at
each attempt's placement ``P`` (``job.scheduled``) and close ``S`` (``job.preempted``, ``job.recovering``, the job's
end, or else the next attempt's placement, or ``E``); every time is clamped into ``[A, E]`` and after the previous
cut, so the parts add up to ``E - A`` exactly.

- Between attempts (and before the first, and after the last until ``E``): ``queued``, unless the attempt before
  ended in a fault (``job.recovering``): then ``recovery`` (the retry's back-off and the wait for re-placement).
- Within an attempt ``[P, S)``, with ``N`` its notice (``job.preempting``; none: ``S``) and ``W = min(N, S)``:

  - ``recovery`` from ``P`` until the gang's first step ``F`` (the latest of its shards' first ``shard.progress`` in
    the attempt: the ranks of a local-SGD gang step alone until their first sync, and a rank that starts late holds
    the gang back): loading, rendezvous, resuming. A job whose shards have reported no step at all (a user's
    command that does not write the progress channel) counts from every shard started (``job.running``) instead;
  - ``recomputed`` from ``F`` until the gang caught up ``C``: the moment its last shard passed the highest step any
    earlier attempt reported (each shard's crossing interpolated between its two reports around it); steps at or
    below that were taken before;
  - ``productive`` (``degraded`` on a degraded placement) from ``C`` until ``W``, or until the fault ``T``;
  - after a fault (the attempt ended in ``job.recovering`` or ``job.failed``, or a shard reported failing for
    another cause than ``REVOKED``), ``recovery`` from ``T`` until ``W``: ``T`` is the gang's last step report (a
    rank whose step or sync failed reports its last step at once, dated when that step ended, so the report is not
    up to a second short: ``training.steps.Steps.report_last``), or the first shard failure where no step was
    reported. A survivor blocked in a collective with a dead peer until its timeout took no step meanwhile;
  - ``notice`` from ``N`` until ``S``, whatever the gang did meanwhile (it checkpoints and stops at its next sync).

A preempted gang resumes from the checkpoint it wrote on notice, past the highest step it had reported: its ledger
shows the notice, the queue wait and the restart, and no recomputed work. A **straggler** the fault manager found
(``JobStraggling``: since when one rank held the gang back, and how much slower it was, ``ratio``) turns the share
``1 - 1/ratio`` of the attempt's productive (or degraded) time from then on into ``straggler``: the gang advanced at
``1/ratio`` of its pace, and the rest is what the straggler cost, until the swap closed the attempt (or, not swapped,
until its end).
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum

from shardyard.events import (
    FailureCause,
    JobAccepted,
    JobCancelled,
    JobFailed,
    JobPreempted,
    JobPreempting,
    JobRecovering,
    JobResized,
    JobRunning,
    JobScheduled,
    JobStraggling,
    JobSucceeded,
    ShardFailed,
    ShardProgress,
)
from shardyard.goodput.ledger import Ledger, Part, ledger_of
from shardyard.lifecycle import TERMINAL, JobState, LifecycleFact, moves

NOT_FAULTS = frozenset({FailureCause.REVOKED})
"""Shard failures that are no fault of the attempt: the scheduler stopped the shard on purpose."""


class Close(Enum):
    FAULT = "fault"
    PREEMPTED = "preempted"
    RESIZED = "resized"
    """Re-formed at another size: its next attempt resumes from the live state (its start is restart time, not a
    fault's)."""
    END = "end"


RESTARTS = frozenset({Close.FAULT, Close.RESIZED})
"""Closes after which the wait for the next attempt is recovery and restart, not queueing."""


@dataclass
class AttemptMarks:
    """What the ledger needs of one attempt; every time as its reporter's clock gave it."""

    number: int
    placed_at: datetime | None = None
    degraded: bool = False
    running_at: datetime | None = None
    notice_at: datetime | None = None
    closed_at: datetime | None = None
    closed_by: Close | None = None
    failed_at: datetime | None = None
    """The first shard failure of the attempt (a cause in ``NOT_FAULTS`` aside)."""
    prior_high: int = -1
    """The highest step earlier attempts reported, as known at this attempt's first step (-1: none)."""
    shards: dict[int, "ShardMarks"] = field(default_factory=dict)
    """Each shard's steps, by its index (a few marks each)."""
    straggling: tuple[datetime, float] | None = None
    """Since when a straggler held the gang back, and how much slower it was (the first ``JobStraggling``)."""

    def progress(self, shard: int, at: datetime, step: int) -> None:
        marks = self.shards.get(shard)
        if marks is None:
            self.shards[shard] = ShardMarks(at, (at, step), at if step > self.prior_high else None)
        else:
            marks.progress(at, step, self.prior_high)

    @property
    def first_step_at(self) -> datetime | None:
        """When the gang took its first step: every shard that reported had taken one (the ranks of a local-SGD gang
        step alone until their first sync, and one that starts late holds the gang back)."""
        return max((marks.first_at for marks in self.shards.values()), default=None)

    @property
    def caught_up_at(self) -> datetime | None:
        """When every shard that reported had passed ``prior_high`` (None: one has not)."""
        caught = [marks.caught_up_at for marks in self.shards.values()]
        return None if not caught or None in caught else max(at for at in caught if at is not None)

    @property
    def last_step(self) -> tuple[datetime, int] | None:
        """The latest report's time and the highest step of the attempt so far, any shard's."""
        if not self.shards:
            return None
        return max(marks.last[0] for marks in self.shards.values()), max(m.last[1] for m in self.shards.values())

    @property
    def faulted(self) -> bool:
        return self.closed_by is Close.FAULT or (self.closed_by is None and self.failed_at is not None)


@dataclass
class ShardMarks:
    """One shard's steps in an attempt: its first step, its latest report and highest step, and when it passed the
    highest step of the earlier attempts (interpolated between its two reports around it)."""

    first_at: datetime
    last: tuple[datetime, int]
    caught_up_at: datetime | None

    def progress(self, at: datetime, step: int, high: int) -> None:
        self.first_at = min(self.first_at, at)  # an earlier report read late
        if step > high:
            if self.caught_up_at is None:
                self.caught_up_at = _crossing(self.last, (at, step), high)
            else:
                self.caught_up_at = min(self.caught_up_at, at)
        self.last = (max(at, self.last[0]), max(step, self.last[1]))


def _crossing(before: tuple[datetime, int], after: tuple[datetime, int], high: int) -> datetime:
    """When the gang passed step ``high``, between a report at or below it and the next one above it."""
    (t0, s0), (t1, s1) = before, after
    if t1 <= t0 or s1 <= s0:
        return max(t0, t1)
    return t0 + (t1 - t0) * ((high - s0) / (s1 - s0))


@dataclass
class GoodputFold:
    """One job's marks. ``apply`` a lifecycle fact, ``on_shard`` a shard event (each returns whether it changed the
    marks; a shard's may come before the job's acceptance), and ``ledger(now)`` at any time."""

    submitted_at: datetime | None = None
    """From its acceptance; None until that is read (a follower may hand over the shard topic's events first)."""
    state: JobState = JobState.ACCEPTED
    placed_term: int = 0
    ended_at: datetime | None = None
    attempts: dict[int, AttemptMarks] = field(default_factory=dict)
    reports_steps: bool = False
    """Whether any shard of the job ever reported a step."""

    @classmethod
    def of(cls, accepted: JobAccepted) -> "GoodputFold":
        return cls(submitted_at=accepted.spec.submitted_at)

    def attempt(self, number: int) -> AttemptMarks:
        marks = self.attempts.get(number)
        if marks is None:
            marks = self.attempts[number] = AttemptMarks(number)
        return marks

    def apply(self, event: LifecycleFact) -> bool:
        """Fold one lifecycle fact; False when it changes nothing."""
        if isinstance(event, JobAccepted):
            if self.submitted_at is not None:
                return False
            self.submitted_at = event.spec.submitted_at
            return True
        if isinstance(event, JobPreempting):
            return self._notice(event)
        if isinstance(event, JobStraggling):
            marks = self.attempt(event.attempt)
            if marks.straggling is not None or event.ratio <= 1.0:
                return False
            marks.straggling = (event.since, event.ratio)
            return True
        target = moves(self.state, event)
        if target is None:
            return False
        if isinstance(event, JobScheduled):
            if event.term < self.placed_term:
                return False  # a deposed leader's placement, fenced as the scheduler fences it
            self.placed_term = event.term
            marks = self.attempt(event.attempt)
            marks.placed_at = event.occurred_at
            marks.degraded = event.degraded or any(p.degraded for p in event.placements if not p.spare)
        self.state = target
        match event:
            case JobRunning():
                self.attempt(event.attempt).running_at = event.occurred_at
            case JobPreempted():
                self._close(event.attempt, event.occurred_at, Close.PREEMPTED)
            case JobRecovering():
                self._close(event.attempt, event.occurred_at, Close.FAULT)
            case JobResized():
                self._close(event.attempt, event.occurred_at, Close.RESIZED)
            case JobFailed():
                self._close(event.attempt, event.occurred_at, Close.FAULT)
            case JobSucceeded():
                self._close(event.attempt, event.occurred_at, Close.END)
            case JobCancelled():
                self._close(self._current(), event.occurred_at, Close.END)
        if target in TERMINAL:
            self.ended_at = event.occurred_at
        return True

    def on_shard(self, event: ShardProgress | ShardFailed) -> bool:
        """Fold one shard event (other kinds change nothing and need not be passed)."""
        if isinstance(event, ShardProgress):
            marks = self.attempt(event.attempt)
            if not marks.shards:
                marks.prior_high = self._high_before(event.attempt)
            before = (marks.first_step_at, marks.last_step, marks.caught_up_at)
            marks.progress(event.shard_index, event.occurred_at, event.step)
            self.reports_steps = True
            return (marks.first_step_at, marks.last_step, marks.caught_up_at) != before
        if event.cause in NOT_FAULTS:
            return False
        marks = self.attempt(event.attempt)
        if marks.failed_at is not None and marks.failed_at <= event.occurred_at:
            return False
        marks.failed_at = event.occurred_at
        return True

    def _notice(self, event: JobPreempting) -> bool:
        if self.state not in (JobState.SCHEDULED, JobState.RUNNING):
            return False
        marks = self.attempt(event.attempt)
        if marks.notice_at is not None or marks.closed_at is not None:
            return False
        marks.notice_at = event.occurred_at
        return True

    def _close(self, number: int, at: datetime, by: Close) -> None:
        marks = self.attempts.get(number)
        if marks is not None and marks.closed_at is None:
            marks.closed_at, marks.closed_by = at, by

    def _current(self) -> int:
        placed = [n for n, marks in self.attempts.items() if marks.placed_at is not None]
        return max(placed, default=0)

    def _high_before(self, number: int) -> int:
        steps = [m.last_step[1] for n, m in self.attempts.items() if n < number and m.last_step is not None]
        return max(steps, default=-1)

    def ledger(self, now: datetime) -> Ledger:
        """The ledger from submission to the job's end, or to ``now`` while it has not ended; all 0 before its
        acceptance was read."""
        sums: dict[Part, timedelta] = {}
        for segment in self.segments(now):
            sums[segment.part] = sums.get(segment.part, timedelta(0)) + (segment.end - segment.start)
        return ledger_of({part: spent.total_seconds() for part, spent in sums.items()})

    def segments(self, now: datetime) -> list["Segment"]:
        """The job's time as the walk cuts it: one segment per stretch of one part, in order, each beginning where
        the one before ended (the same part twice in a row is one segment); empty before its acceptance was read.
        What a timeline or a trace draws (a span per segment)."""
        if self.submitted_at is None:
            return []
        return _Walk(self, self.submitted_at, self.ended_at or now).run()


@dataclass(frozen=True)
class Segment:
    part: Part
    start: datetime
    end: datetime


class _Walk:
    """The walk of the module's doc over one fold's marks, into segments (summed as timedeltas: exact
    microseconds)."""

    def __init__(self, fold: GoodputFold, start: datetime, end: datetime) -> None:
        self.fold = fold
        self.start = start
        self.end = max(end, start)
        self.segments: list[Segment] = []

    def add(self, part: Part, begin: datetime, end: datetime) -> None:
        if end <= begin:
            return
        last = self.segments[-1] if self.segments else None
        if last is not None and last.part is part and last.end == begin:
            self.segments[-1] = Segment(part, last.start, end)
        else:
            self.segments.append(Segment(part, begin, end))

    def clamp(self, at: datetime | None, low: datetime, high: datetime) -> datetime:
        return high if at is None else min(max(at, low), high)

    def run(self) -> list[Segment]:
        placed = sorted(
            (m for m in self.fold.attempts.values() if m.placed_at is not None), key=lambda marks: marks.number
        )
        cursor, after_fault = self.start, False
        for index, marks in enumerate(placed):
            begin = self.clamp(marks.placed_at, cursor, self.end)
            self.add(Part.RECOVERY if after_fault else Part.QUEUED, cursor, begin)
            following = placed[index + 1].placed_at if index + 1 < len(placed) else None
            close = min((at for at in (marks.closed_at, following) if at is not None), default=self.end)
            cursor = self.clamp(close, begin, self.end)
            self.attempt(marks, begin, cursor)
            after_fault = marks.closed_by in RESTARTS
        self.add(Part.RECOVERY if after_fault else Part.QUEUED, cursor, self.end)
        return self.segments

    def attempt(self, marks: AttemptMarks, begin: datetime, close: datetime) -> None:
        run_end = self.clamp(marks.notice_at, begin, close)
        if marks.first_step_at is not None:
            first = self.clamp(marks.first_step_at, begin, run_end)
            caught = self.clamp(marks.caught_up_at, first, run_end)
            last = marks.last_step[0] if marks.last_step is not None else None
        elif not self.fold.reports_steps and marks.running_at is not None:
            first = caught = self.clamp(marks.running_at, begin, run_end)
            last = None
        else:
            first = caught = run_end
            last = None
        fault = run_end
        if marks.faulted:
            tail_from = last if last is not None else marks.failed_at
            fault = self.clamp(tail_from or run_end, first, run_end)
        self.add(Part.RECOVERY, begin, first)
        self.add(Part.RECOMPUTED, first, min(caught, fault))
        self.training(marks, caught, fault)
        self.add(Part.RECOVERY, fault, run_end)
        self.add(Part.NOTICE, run_end, close)

    def training(self, marks: AttemptMarks, begin: datetime, end: datetime) -> None:
        """Productive (or degraded) time from ``begin`` to ``end``, less what a straggler cost from its start on."""
        part = Part.DEGRADED if marks.degraded else Part.PRODUCTIVE
        if marks.straggling is None or end <= begin:
            self.add(part, begin, end)
            return
        since, ratio = marks.straggling
        slowed_from = self.clamp(since, begin, end)
        lost = (end - slowed_from) * (1.0 - 1.0 / ratio)
        self.add(part, begin, end - lost)
        self.add(Part.STRAGGLER, end - lost, end)


def ledger_of_events(accepted: JobAccepted, events: Iterable[object], now: datetime) -> Ledger:
    """The ledger of one job's events (lifecycle facts and shard events, in any order; others are passed over) at
    ``now``."""
    fold = GoodputFold.of(accepted)
    for event in events:
        if isinstance(event, ShardProgress | ShardFailed):
            fold.on_shard(event)
        elif isinstance(event, LifecycleFact):
            fold.apply(event)
    return fold.ledger(now)
