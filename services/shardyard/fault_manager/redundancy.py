"""Adaptive redundancy (S11): the spare ratio follows the recent shard failure rate. Pure: time comes in.

Over a sliding window, ``failure_rate = failures / attempts`` where attempts are shard attempts seen (started or
failed) and failures are shard attempts that failed for a cause worth a retry (user errors and revocations say
nothing about the cluster). A dead shard takes its peers down with it: they report COMM_ERROR. Counting those would
make one dead node in an 8-shard gang look like 8 failures, so each failed gang attempt counts its failures other
than COMM_ERROR, or one failure when all it has is COMM_ERRORs (a culprit that did not report).

``ratio = clamp(2 x rate, min, max)`` rounded up to a ``step`` (5 % -> 0.10, 7.5 % -> 0.15), published only when the
step changes, so it neither drifts with every event nor flaps between equal steps.
"""

import heapq
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shardyard.events import FailureCause, RedundancyChanged, ShardFailed, ShardStarted
from shardyard.fault_manager.recovery import Disposition, disposition

ShardKey = tuple[str, int, int]
"""job, attempt, shard"""
GangKey = tuple[str, int]
"""job, attempt"""


@dataclass(frozen=True)
class RedundancyPolicy:
    window_s: float = 600.0
    min_ratio: float = 0.0
    max_ratio: float = 0.5
    step: float = 0.05


def failure_rate(failures: int, attempts: int) -> float:
    return min(1.0, failures / attempts) if attempts else 0.0


def target_ratio(failures: int, attempts: int, policy: RedundancyPolicy) -> float:
    """``clamp(2 x failure_rate, min_ratio, max_ratio)`` rounded up to a multiple of ``step`` (kept in bounds)."""
    raw = min(max(2 * failure_rate(failures, attempts), policy.min_ratio), policy.max_ratio)
    steps = math.ceil(round(raw / policy.step, 9))  # round first: 0.1 / 0.05 is 2.0000000000000004
    return round(min(max(steps * policy.step, policy.min_ratio), policy.max_ratio), 9)


def _gang_failures(non_comm: int, comm: int) -> int:
    return non_comm if non_comm else min(comm, 1)


@dataclass
class ShardWindow:
    """Shard attempts and their failures over the last ``window_s`` seconds, idempotent per shard attempt. Times
    are the events' own (so a replay after a restart rebuilds the same window); arrival order does not matter."""

    window_s: float
    _seen: dict[ShardKey, datetime] = field(default_factory=dict)
    """attempt -> when it was last heard of (started, or failed)"""
    _failed: dict[ShardKey, tuple[datetime, bool]] = field(default_factory=dict)
    """attempt -> when it failed, and whether with a COMM_ERROR"""
    _gangs: dict[GangKey, list[int]] = field(default_factory=dict)
    """gang attempt -> [failures other than COMM_ERROR, COMM_ERRORs]"""
    _expiry: list[tuple[datetime, int, ShardKey]] = field(default_factory=list)
    _seq: int = 0
    failures: int = 0
    """failures as counted (see the module docstring), kept up to date"""

    @property
    def attempts(self) -> int:
        return len(self._seen)

    def started(self, key: ShardKey, at: datetime) -> None:
        self._touch(key, at)

    def failed(self, key: ShardKey, cause: FailureCause, at: datetime) -> None:
        if key in self._failed:
            return
        self._touch(key, at)
        comm = cause is FailureCause.COMM_ERROR
        self._failed[key] = (at, comm)
        self._count(key, comm, +1)
        self._push(at, key)

    def prune(self, now: datetime) -> None:
        """Forget what happened before the window."""
        cutoff = now - timedelta(seconds=self.window_s)
        while self._expiry and self._expiry[0][0] < cutoff:
            at, _, key = heapq.heappop(self._expiry)
            if self._seen.get(key) == at:
                del self._seen[key]
            failure = self._failed.get(key)
            if failure is not None and failure[0] == at:
                del self._failed[key]
                self._count(key, failure[1], -1)

    def _touch(self, key: ShardKey, at: datetime) -> None:
        known = self._seen.get(key)
        if known is None or at > known:
            self._seen[key] = at
            self._push(at, key)

    def _push(self, at: datetime, key: ShardKey) -> None:
        self._seq += 1
        heapq.heappush(self._expiry, (at, self._seq, key))

    def _count(self, key: ShardKey, comm: bool, delta: int) -> None:
        gang_key = (key[0], key[1])
        counts = self._gangs.setdefault(gang_key, [0, 0])
        before = _gang_failures(*counts)
        counts[1 if comm else 0] += delta
        self.failures += _gang_failures(*counts) - before
        if counts == [0, 0]:
            del self._gangs[gang_key]


@dataclass
class RedundancyTracker:
    policy: RedundancyPolicy = field(default_factory=RedundancyPolicy)
    ratio: float = 0.0
    """the ratio in force: the last one published (restored from the compacted topic on start)"""
    window: ShardWindow = field(init=False)

    def __post_init__(self) -> None:
        self.window = ShardWindow(self.policy.window_s)

    def apply(self, event: object) -> None:
        match event:
            case RedundancyChanged():
                self.ratio = event.ratio
            case ShardStarted():
                self.window.started((event.job_id, event.attempt, event.shard_index), event.occurred_at)
            case ShardFailed() if disposition(event.cause) is Disposition.RETRY:
                key = (event.job_id, event.attempt, event.shard_index)
                self.window.failed(key, event.cause, event.occurred_at)
            case _:
                pass

    def check(self, now: datetime) -> RedundancyChanged | None:
        """A new ratio when the window's failure rate moved it to another step, else None."""
        self.window.prune(now)
        attempts, failures = self.window.attempts, self.window.failures
        ratio = target_ratio(failures, attempts, self.policy)
        if math.isclose(ratio, self.ratio, abs_tol=1e-9):
            return None
        change = RedundancyChanged(
            occurred_at=now,
            ratio=ratio,
            previous_ratio=self.ratio,
            failure_rate=failure_rate(failures, attempts),
            window_s=self.policy.window_s,
            shard_attempts=attempts,
            shard_failures=failures,
        )
        self.apply(change)
        return change
