"""What the monitor's metrics need beyond the cluster picture: heartbeat lag, shard failures by cause, recovery times
and AllReduce totals, folded from the same events as the view."""

from dataclasses import dataclass, field
from datetime import datetime

from shardyard.clock import Clock, SystemClock
from shardyard.events import (
    Heartbeat,
    JobCancelled,
    JobFailed,
    JobRecovering,
    JobScheduled,
    JobSucceeded,
    JobUnschedulable,
    NodeLease,
    NodeLeases,
    ShardFailed,
    ShardProgress,
)


@dataclass
class SyncTotals:
    """One shard's parameter syncs summed from its progress reports: counters, so ``rate()`` gives time and bytes
    per second. Agents report at every sync, so the rare sync between two reports is counted at the later one's
    figures."""

    attempt: int = 0
    syncs: int = 0
    """The last report's count, of this attempt (each attempt's runner counts from 0)."""
    count: int = 0
    seconds: float = 0.0
    bytes: int = 0


MAX_ERRORS = 10_000
"""Start-estimate errors kept (the newest)."""


@dataclass
class Telemetry:
    """The clock reads arrival times only; every other figure uses the events' own times."""

    clock: Clock = field(default_factory=SystemClock, repr=False)
    heartbeat_lag_s: dict[str, float] = field(default_factory=dict)
    """Per node: the monitor's receipt of its last heartbeat minus the heartbeat's ``occurred_at``."""
    shard_failures: dict[str, int] = field(default_factory=dict)
    """Failed shard attempts by cause, each (job, shard, attempt) once."""
    recovery_s: list[float] = field(default_factory=list)
    """Per recovery: from the first plan (``job.recovering``) to the re-formed gang's first training progress."""
    syncs: dict[tuple[str, int], SyncTotals] = field(default_factory=dict)
    start_error_s: list[float] = field(default_factory=list)
    """Per job that held an estimated start when it was placed: the placement's time minus that estimate, the p50
    (negative: earlier than estimated), bounded to the last ``MAX_ERRORS``."""
    start_error_p90_s: list[float] = field(default_factory=list)
    """The same against the p90, of the jobs whose estimate carried one (positive: later than 90 % of the plan's
    samples), bounded alike."""
    _estimated: dict[str, tuple[datetime, datetime | None]] = field(default_factory=dict)
    """Job -> the (p50, p90) estimated start of its last ``job.unschedulable`` that carried one."""
    _failed: set[tuple[str, int, int]] = field(default_factory=set)
    _recovering: dict[str, tuple[int, datetime]] = field(default_factory=dict)
    """Job -> (attempt that failed last, when its recovery began)."""

    def fold(self, event: object) -> None:
        match event:
            case Heartbeat() | NodeLease():
                self.heartbeat_lag_s[event.node_id] = (self.clock.now() - event.occurred_at).total_seconds()
            case NodeLeases():
                now = self.clock.now()
                for lease in event.leases:
                    self.heartbeat_lag_s[lease.node_id] = (now - lease.occurred_at).total_seconds()
            case ShardFailed() if (event.job_id, event.shard_index, event.attempt) not in self._failed:
                self._failed.add((event.job_id, event.shard_index, event.attempt))
                self.shard_failures[event.cause] = self.shard_failures.get(event.cause, 0) + 1
            case JobRecovering():
                began = self._recovering.get(event.job_id, (0, event.occurred_at))[1]  # a retry extends the outage
                self._recovering[event.job_id] = (event.attempt, began)
            case ShardProgress():
                self._synced(event)
                failed = self._recovering.get(event.job_id)
                if failed is not None and event.attempt > failed[0]:
                    del self._recovering[event.job_id]
                    self.recovery_s.append((event.occurred_at - failed[1]).total_seconds())
            case JobUnschedulable():
                if event.estimated_start is None:
                    self._estimated.pop(event.job_id, None)
                else:
                    self._estimated[event.job_id] = (event.estimated_start, event.estimated_start_p90)
            case JobScheduled():
                self._started(event)
            case JobSucceeded() | JobFailed() | JobCancelled():
                self._estimated.pop(event.job_id, None)
                self._recovering.pop(event.job_id, None)
                for key in [k for k in self.syncs if k[0] == event.job_id]:
                    del self.syncs[key]

    def _started(self, event: JobScheduled) -> None:
        """A placement ends the job's estimate: how far it was from its p50, and from its p90 where it had one."""
        p50, p90 = self._estimated.pop(event.job_id, (None, None))
        for estimated, errors in ((p50, self.start_error_s), (p90, self.start_error_p90_s)):
            if estimated is not None:
                errors.append((event.occurred_at - estimated).total_seconds())
                del errors[:-MAX_ERRORS]

    def _synced(self, event: ShardProgress) -> None:
        totals = self.syncs.setdefault((event.job_id, event.shard_index), SyncTotals())
        if event.attempt < totals.attempt:
            return  # a late report of an attempt already replaced
        if event.attempt > totals.attempt:
            totals.attempt, totals.syncs = event.attempt, 0
        new = event.syncs - totals.syncs
        if new > 0:
            totals.count += new
            totals.seconds += new * event.allreduce_ms / 1000.0
            totals.bytes += new * event.allreduce_bytes
            totals.syncs = event.syncs
