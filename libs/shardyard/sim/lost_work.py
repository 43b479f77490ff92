"""Lost work: periodic checkpoints, preemption notices and restarts, and what each preemption costs. Pure, in
simulated microseconds.

One attempt of a gang, from its start ``s``:

- an attempt after a preemption first restarts (launch, load its checkpoint): ``restart_s`` on all its GPUs, no
  progress; the first attempt starts at once. Progress starts at ``p = s + restart``;
- it writes a durable checkpoint every ``checkpoint_every_s`` of its progress (``p + every``, ``p + 2 every``, ...),
  in the background (they cost no run time);
- a preemption at ``t`` gives the gang a notice of ``notice_s`` (the scheduler's preempt deadline). A gang whose code
  checkpoints on notice (``notice_share`` of the jobs, picked by a hash of the job id, so the same jobs in every
  run) stops and writes a checkpoint in ``checkpoint_s`` when that fits in the notice: it keeps every step, and
  gives its GPUs back at ``t + checkpoint_s``. Any other gang runs on to the deadline ``t + notice_s`` and is stopped
  there: it keeps its work up to its last periodic checkpoint; the rest is recomputed in its next attempt.

An attempt's time on its GPUs splits into four parts (``Spent``): ``restart`` before the notice; ``productive``,
the progress it keeps; ``recomputed``, progress before the notice past what it keeps; and ``stopping``, the rest:
from the notice (or the kept checkpoint, when one falls within the notice) to the GPUs' release. The work lost to
preemption is restart + recomputed + stopping, on every GPU of the gang.
"""

import math
import zlib
from dataclasses import dataclass

from shardyard.sim.defaults import (
    DEFAULT_CHECKPOINT_EVERY_S,
    DEFAULT_CHECKPOINT_S,
    DEFAULT_NOTICE_S,
    DEFAULT_NOTICE_SHARE,
    DEFAULT_RESIZE_S,
    DEFAULT_RESTART_S,
)

US = 1_000_000
"""Simulated microseconds per second."""


@dataclass(frozen=True)
class WorkModel:
    """How the simulated jobs checkpoint, take a preemption notice and restart (``shardyard simulate`` flags)."""

    checkpoint_s: float = DEFAULT_CHECKPOINT_S
    """Seconds a gang takes to write a checkpoint on notice."""
    checkpoint_every_s: float = DEFAULT_CHECKPOINT_EVERY_S
    """Seconds of progress between periodic checkpoints (a trace's ``checkpoint_every_s`` overrides it per job)."""
    notice_s: float = DEFAULT_NOTICE_S
    """Seconds from a preemption to the deadline at which a gang still running is stopped."""
    notice_share: float = DEFAULT_NOTICE_SHARE
    """The share of the jobs whose code checkpoints on notice (0..1)."""
    restart_s: float = DEFAULT_RESTART_S
    """Seconds every restart after a preemption holds the gang's GPUs without progress."""
    resize_s: float = DEFAULT_RESIZE_S
    """Seconds every resize of an elastic gang (a re-formation from live state, no work lost) holds its new GPUs
    without progress (``sim.gang``)."""

    def __post_init__(self) -> None:
        """Raises ValueError ``"<field>: <problem>"`` for the first field out of range."""
        for name in ("checkpoint_s", "notice_s", "restart_s", "resize_s"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"{name}: must be a number of seconds, at least 0")
        if not 0 < self.checkpoint_every_s < math.inf:
            raise ValueError("checkpoint_every_s: must be a number of seconds above 0")
        if not 0 <= self.notice_share <= 1:
            raise ValueError("notice_share: must be a share within 0..1")

    def honours_notice(self, job_id: str) -> bool:
        """Whether ``job_id``'s code checkpoints on notice in time: it is among the first ``notice_share`` of the
        jobs by a hash of its id, and its checkpoint fits in the notice."""
        return self.checkpoint_s <= self.notice_s and zlib.crc32(job_id.encode()) / 2**32 < self.notice_share


@dataclass(frozen=True)
class Attempt:
    """When one attempt of a gang started, restarted and checkpoints."""

    started_us: int
    restart_us: int
    """0 for a first attempt."""
    every_us: int
    """Progress between periodic checkpoints."""

    @property
    def progress_us(self) -> int:
        """When it starts making progress: after its restart."""
        return self.started_us + self.restart_us

    def checkpointed_us(self, now_us: int) -> int | None:
        """Its last periodic checkpoint at or before ``now_us``; None: none yet in this attempt."""
        ran = now_us - self.progress_us
        if ran < self.every_us:
            return None
        return self.progress_us + ran // self.every_us * self.every_us

    def next_checkpoint_us(self, now_us: int) -> int:
        """Its first periodic checkpoint after ``now_us``."""
        ran = max(0, now_us - self.progress_us)
        return self.progress_us + (ran // self.every_us + 1) * self.every_us


@dataclass(frozen=True)
class Stopping:
    """A preemption of one attempt: the notice, the GPUs' release and the progress it keeps."""

    notice_us: int
    release_us: int
    kept_us: int
    """When the progress it keeps ends: its checkpoint on notice, its last periodic checkpoint by the deadline, or
    its progress start (it keeps nothing of this attempt)."""
    honoured: bool
    """Whether it checkpointed on notice."""


def stop(model: WorkModel, attempt: Attempt, job_id: str, notice_us: int) -> Stopping:
    """How ``attempt`` of ``job_id`` stops when preempted at ``notice_us``."""
    if model.honours_notice(job_id):
        release = notice_us + to_us(model.checkpoint_s)
        kept = max(notice_us, attempt.progress_us)
        return Stopping(notice_us, release, kept, honoured=True)
    release = notice_us + to_us(model.notice_s)
    checkpointed = attempt.checkpointed_us(release)
    return Stopping(notice_us, release, attempt.progress_us if checkpointed is None else checkpointed, honoured=False)


@dataclass
class Spent:
    """GPU-microseconds of the attempts that ended, by part (see the module's doc)."""

    productive: int = 0
    restart: int = 0
    recomputed: int = 0
    stopping: int = 0
    resizing: int = 0
    """Resize pauses of elastic gangs (``sim.gang``): no progress, but not lost to preemption either."""

    @property
    def lost(self) -> int:
        """Lost to preemption: restarts, recomputed work and stopping."""
        return self.restart + self.recomputed + self.stopping

    def add(self, other: "Spent", gpus: int = 1) -> None:
        self.productive += gpus * other.productive
        self.restart += gpus * other.restart
        self.recomputed += gpus * other.recomputed
        self.stopping += gpus * other.stopping
        self.resizing += gpus * other.resizing


def finished(attempt: Attempt, finish_us: int) -> Spent:
    """One GPU's time in an attempt that ran to its end."""
    return Spent(productive=finish_us - attempt.progress_us, restart=attempt.restart_us)


def preempted(attempt: Attempt, stopping: Stopping) -> Spent:
    """One GPU's time in an attempt that was preempted: its four parts add up to its start to its release."""
    progress, notice = attempt.progress_us, stopping.notice_us
    restart = min(progress, notice) - attempt.started_us
    productive = max(0, stopping.kept_us - progress)
    recomputed = max(0, notice - max(stopping.kept_us, progress))
    held = stopping.release_us - attempt.started_us
    return Spent(productive, restart, recomputed, held - restart - productive - recomputed)


def to_us(seconds: float) -> int:
    """``seconds`` as whole microseconds, never below it (so a wait of ``seconds`` has passed at the result)."""
    us = math.ceil(seconds * US)
    return us + 1 if us / US < seconds else us
