"""How often the gang syncs: slow parameter syncs widen the sync interval. Pure (no torch, no clock).

Each rank judges its own syncs: one is slow when it took more than ``factor`` x the median of the previous ones
(and at least ``floor_ms`` more: a small model's syncs take a millisecond or two, and a busy CPU delays one by tens
of milliseconds now and then; that is jitter, not a slow network). Ranks see different times for
the same collective (an early rank also measures its wait for the last one), so a rank's judgement is only a
*vote*: it rides in the control slot of the next sync's AllReduce, beside the stop flag, and every rank reads the
same sum. The sync before is slow for the gang when any rank voted so. Only that agreed answer moves the streak,
the count and the interval, so every rank widens at the same sync, to the same interval: they cannot diverge.
Two agreed slow syncs in a row double the interval, up to ``max_multiple`` x the configured one; the history
then starts afresh, so the new pace becomes the norm instead of doubling again for the same slowdown.

A sync interval of 1 is never widened. It averages gradients (synchronous data parallelism: every rank applies the
same update); any wider interval averages parameters (local SGD), a different optimisation that lets the ranks
drift apart between syncs. A slow network must not change what a job computes behind its back, so there the slow
syncs are only counted and reported (``slow_syncs``), for the operator to act on.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

DEFAULT_FLOOR_MS = 50.0
MIN_HISTORY = 3
HISTORY = 16
SLOW_STREAK = 2
MAX_MULTIPLE = 8


def is_slow(ms: float, previous: list[float], factor: float, floor_ms: float = DEFAULT_FLOOR_MS) -> bool:
    """Whether a sync of ``ms`` is slow against the ``previous`` ones (never before ``MIN_HISTORY`` of them)."""
    if len(previous) < MIN_HISTORY:
        return False
    median = statistics.median(previous)
    return ms > factor * median and ms - median >= floor_ms


@dataclass
class SyncPacer:
    base_interval: int
    factor: float
    floor_ms: float = DEFAULT_FLOOR_MS
    interval: int = 0
    """The current sync interval (steps); starts at ``base_interval``."""
    slow_syncs: int = 0
    """Syncs the gang agreed were slow."""
    vote: bool = False
    """This rank's judgement of its latest sync, to send with the next one."""
    streak: int = 0
    history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))

    def __post_init__(self) -> None:
        if self.base_interval < 1:
            raise ValueError(f"base_interval must be >= 1, got {self.base_interval}")
        self.interval = self.interval or self.base_interval

    @property
    def max_interval(self) -> int:
        """``MAX_MULTIPLE`` x the configured interval; 1 stays 1 (gradient averaging is never turned into local
        SGD)."""
        return self.base_interval * MAX_MULTIPLE if self.base_interval > 1 else 1

    def observe(self, ms: float, *, agreed_slow: bool) -> int | None:
        """After a sync that took this rank ``ms``: ``agreed_slow`` is the gang's verdict on the sync before it (the
        votes this one carried). Returns the new interval when it changed, else None."""
        if agreed_slow:
            self.slow_syncs += 1
            self.streak += 1
        else:
            self.streak = 0
        if self.streak >= SLOW_STREAK and self.interval < self.max_interval:
            self.interval = min(2 * self.interval, self.max_interval)
            self.streak = 0
            self.history.clear()
            self.vote = False
            return self.interval
        self.vote = is_slow(ms, list(self.history), self.factor, self.floor_ms)
        self.history.append(ms)
        return None
