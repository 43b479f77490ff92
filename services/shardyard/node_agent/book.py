"""The agent's record of its shard attempts, pure: which assignments to run, hold (spares) and stop, which shards a
lost lease or a faulted GPU stops, what a shard's reports mean (progress, checkpointed) and what its end means
(completed, failed with a cause, or preempted with a checkpoint).

Each (job, shard, attempt) here is in one :class:`ShardAttempt` state, moved only along :data:`TRANSITIONS`, so a
redelivered or late assignment, revocation or stop request cannot run an attempt twice or revive an ended one. Why a
running shard is being stopped (the lease lost, a GPU faulted) is noted beside its state: either may meet any live
state, and only changes how its end is reported."""

import contextlib
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from shardyard.errors import ShardyardError
from shardyard.events import (
    Event,
    FailureCause,
    RunningShard,
    ShardAssignment,
    ShardCheckpointed,
    ShardProgress,
    ShardRevocation,
    ShardStarted,
    ShardStopRequest,
)
from shardyard.node_agent import reports
from shardyard.node_agent.environment import ShardPaths, opened_env, shard_paths
from shardyard.node_agent.reports import ShardKey
from shardyard.secret_env import SecretEnvError
from shardyard.training.storage import Space

log = logging.getLogger(__name__)


class ShardAttempt(StrEnum):
    SPARE = "SPARE"
    """GPUs held in reserve for the gang: recorded, no process, not in heartbeats' ``running``."""
    RUNNING = "RUNNING"
    """Launched: its process is being started or runs."""
    STOPPING = "STOPPING"
    """Asked to checkpoint and stop (preemption); it runs until it does."""
    REVOKED = "REVOKED"
    """Being killed for the scheduler; its end is not reported (its job has moved on)."""
    ENDED = "ENDED"
    """Its process exited, or never started: ran once, never again."""
    RELEASED = "RELEASED"
    """A spare given back: it never ran and never will."""


ENTRY: Final = frozenset({ShardAttempt.SPARE, ShardAttempt.RUNNING})
"""The states a first assignment of an attempt puts it in."""

LIVE: Final = frozenset({ShardAttempt.RUNNING, ShardAttempt.STOPPING, ShardAttempt.REVOKED})
"""The states of a launched attempt until its end: the node's ``running`` shards."""

TRANSITIONS: Final = MappingProxyType(
    {
        ShardAttempt.SPARE: frozenset(
            {
                ShardAttempt.RUNNING,  # promoted in place: its own assignment came again without ``spare``
                ShardAttempt.RELEASED,  # revoked: nothing runs, nothing to stop
            }
        ),
        ShardAttempt.RUNNING: frozenset(
            {
                ShardAttempt.STOPPING,  # a stop request: signalled once to checkpoint and stop
                ShardAttempt.REVOKED,  # a revocation: terminated, its end goes unreported
                ShardAttempt.ENDED,  # its process exited, or it could not be started: its end is reported
            }
        ),
        ShardAttempt.STOPPING: frozenset(
            {
                ShardAttempt.REVOKED,  # revoked before it stopped (the preemption deadline passed)
                ShardAttempt.ENDED,  # it stopped (preempted), or ended otherwise before it could: reported
            }
        ),
        ShardAttempt.REVOKED: frozenset(
            {
                ShardAttempt.REVOKED,  # a redelivered revocation: terminated again (nothing happens to the dead)
                ShardAttempt.ENDED,  # its process exited: nothing is reported
            }
        ),
        ShardAttempt.ENDED: frozenset(),  # a redelivered assignment is a duplicate
        ShardAttempt.RELEASED: frozenset(),  # a released spare's assignment again is a duplicate
    }
)


def can_move(current: ShardAttempt | None, target: ShardAttempt) -> bool:
    """True when an attempt in ``current`` (None: not seen here yet) may move to ``target``."""
    if current is None:
        return target in ENTRY
    return target in TRANSITIONS[current]


class NotRunning(ShardyardError, KeyError):
    """An end reported for an attempt that is not running here: a bug in the agent, not an event to ignore."""


class Verdict(StrEnum):
    LAUNCH = "LAUNCH"
    HOLD_SPARE = "HOLD_SPARE"
    NOT_MINE = "NOT_MINE"
    DUPLICATE = "DUPLICATE"
    STALE_TERM = "STALE_TERM"


def key_of(event: ShardAssignment | ShardRevocation | ShardStopRequest) -> ShardKey:
    return (event.job_id, event.shard_index, event.attempt)


@dataclass
class AgentBook:
    node_id: str
    max_term: int = 0
    states: dict[ShardKey, ShardAttempt] = field(default_factory=dict)
    """Every attempt this node was assigned, in its state; ended ones stay, so redeliveries are refused."""
    assignments: dict[ShardKey, ShardAssignment] = field(default_factory=dict)
    """The assignment of each attempt that holds GPUs here: spares and live attempts."""
    fenced: dict[ShardKey, str] = field(default_factory=dict)
    """Shards stopped because the agent lost the bus (self-fencing), with the message their end is reported with."""
    gpu_faulted: dict[ShardKey, str] = field(default_factory=dict)
    """Shards stopped because a GPU of theirs faulted, with the message their end is reported with (GPU_FAULT)."""
    utilization: dict[ShardKey, float] = field(default_factory=dict)
    """Cores each running shard uses (its last progress report's ``cpu_percent`` / 100)."""
    sync_intervals: dict[ShardKey, int] = field(default_factory=dict)
    """Each running shard's sync interval as its last progress report gave it."""
    env_key: bytes | None = field(default=None, repr=False)
    """The agents' key to the jobs' environment values: an end's message is redacted of the values themselves."""

    # -- the table ---------------------------------------------------------------------------------------------

    def _move(self, key: ShardKey, target: ShardAttempt) -> bool:
        """Move ``key`` to ``target`` when the table allows it; a refused move changes nothing and says False."""
        current = self.states.get(key)
        if not can_move(current, target):
            log.debug("%s: no move from %s to %s", key, current, target)
            return False
        self.states[key] = target
        return True

    def _in(self, *states: ShardAttempt) -> dict[ShardKey, ShardAssignment]:
        return {key: a for key, a in self.assignments.items() if self.states[key] in states}

    @property
    def running(self) -> dict[ShardKey, ShardAssignment]:
        """Launched attempts until their end (being stopped or revoked included)."""
        return self._in(*LIVE)

    @property
    def spares(self) -> dict[ShardKey, ShardAssignment]:
        return self._in(ShardAttempt.SPARE)

    @property
    def revoked(self) -> frozenset[ShardKey]:
        return frozenset(self._in(ShardAttempt.REVOKED))

    @property
    def stopping(self) -> frozenset[ShardKey]:
        return frozenset(self._in(ShardAttempt.STOPPING))

    def live(self, key: ShardKey) -> ShardAssignment | None:
        """The assignment of a launched attempt that has not ended; None for any other."""
        return self.assignments.get(key) if self.states.get(key) in LIVE else None

    def running_of(self, job_id: str) -> int:
        """How many shards of the job run here."""
        return sum(1 for job, _, _ in self.running if job == job_id)

    def holding(self) -> frozenset[str]:
        """Jobs that hold a spare or run a shard here."""
        return frozenset(job for job, _, _ in self.assignments)

    # -- what the scheduler says -------------------------------------------------------------------------------

    def on_assignment(self, assignment: ShardAssignment) -> Verdict:
        """What to do with an assignment. A (job, shard, attempt) is launched at most once; a spare is only held.
        A spare whose own assignment comes again without ``spare`` is launched in place: it never ran."""
        if assignment.node_id != self.node_id:
            return Verdict.NOT_MINE
        if assignment.term < self.max_term:
            return Verdict.STALE_TERM
        self.max_term = assignment.term
        key = key_of(assignment)
        target = ShardAttempt.SPARE if assignment.spare else ShardAttempt.RUNNING
        if not self._move(key, target):
            return Verdict.DUPLICATE
        self.assignments[key] = assignment
        return Verdict.HOLD_SPARE if target is ShardAttempt.SPARE else Verdict.LAUNCH

    def on_revocation(self, revocation: ShardRevocation) -> ShardKey | None:
        """The running shard to stop, if the revocation is for one of ours and not from an older term. A revoked
        spare is just released (nothing runs)."""
        key = key_of(revocation)
        if revocation.node_id != self.node_id or revocation.term < self.max_term:
            return None
        spare = self.states.get(key) is ShardAttempt.SPARE
        if not self._move(key, ShardAttempt.RELEASED if spare else ShardAttempt.REVOKED):
            return None
        if spare:
            del self.assignments[key]
            return None
        return key

    def on_stop_request(self, request: ShardStopRequest) -> ShardKey | None:
        """The running shard to signal, if the request is for one of ours, not from an older term, and new (a
        shard being stopped or revoked already is left alone)."""
        key = key_of(request)
        if request.node_id != self.node_id or request.term < self.max_term:
            return None
        return key if self._move(key, ShardAttempt.STOPPING) else None

    # -- why shards are stopped --------------------------------------------------------------------------------

    def fence(self, message: str) -> list[ShardKey]:
        """The agent lost the bus: every running shard not fenced yet is to be stopped; its end will be reported
        as FENCED with ``message``. Spares run nothing and stay recorded."""
        keys = [key for key in sorted(self.running) if key not in self.fenced]
        for key in keys:
            self.fenced[key] = message
        return keys

    def gpu_fault(self, faults: Mapping[int, str], started: Collection[ShardKey]) -> list[ShardKey]:
        """GPUs that faulted (index -> fault): every started shard on one, not stopped for it yet, is to be stopped;
        its end will be reported as GPU_FAULT. A shard still being launched is left to the next call (heartbeat)."""
        keys = []
        for key, assignment in sorted(self.running.items()):
            bad = [f"GPU {gpu}: {faults[gpu]}" for gpu in assignment.gpu_indices if gpu in faults]
            if bad and key in started and key not in self.gpu_faulted:
                self.gpu_faulted[key] = "; ".join(bad)
                keys.append(key)
        return keys

    # -- what a shard reports ----------------------------------------------------------------------------------

    def started(self, key: ShardKey, pid: int, *, now: datetime) -> ShardStarted:
        return reports.started(self.node_id, key, pid, now=now)

    def progressed(self, key: ShardKey, report: Mapping[str, Any]) -> bool:
        """Note a progress report's CPU use; True when it is the shard's first."""
        first = key not in self.utilization
        self.utilization[key] = reports.number(report, "cpu_percent") / 100.0
        return first

    def progress(self, key: ShardKey, report: Mapping[str, object], *, now: datetime) -> ShardProgress:
        return reports.progress(self.node_id, key, report, now=now)

    def pace(self, key: ShardKey, report: Mapping[str, object]) -> tuple[int, int] | None:
        """(old, new) when a progress report gives a sync interval other than the shard's previous one."""
        interval = report.get("sync_interval")
        if not isinstance(interval, int) or isinstance(interval, bool):
            return None
        previous = self.sync_intervals.get(key)
        self.sync_intervals[key] = interval
        return None if previous is None or previous == interval else (previous, interval)

    def checkpointed(self, key: ShardKey, report: Mapping[str, object], *, now: datetime) -> ShardCheckpointed | None:
        """A running shard's ``checkpointed`` report as an event naming the checkpoint by its job path; None when the
        report is malformed or the shard is not running."""
        assignment = self.live(key)
        return None if assignment is None else reports.checkpointed(self.node_id, key, assignment, report, now=now)

    # -- what the heartbeat says -------------------------------------------------------------------------------

    def gpu_utilization(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for key, assignment in self.running.items():
            for gpu in assignment.gpu_indices:
                out[gpu] = max(out.get(gpu, 0.0), self.utilization.get(key, 0.01))
        return out

    def running_shards(self, pids: Mapping[ShardKey, int]) -> tuple[RunningShard, ...]:
        return tuple(
            RunningShard(job_id=job, shard_index=shard, attempt=attempt, pid=pids.get((job, shard, attempt)))
            for job, shard, attempt in sorted(self.running)
        )

    def paths(self, assignment: ShardAssignment, mounts: Mapping[str, str]) -> ShardPaths:
        return shard_paths(assignment, mounts)

    # -- the end -----------------------------------------------------------------------------------------------

    def finished(
        self,
        key: ShardKey,
        returncode: int | None,
        *,
        now: datetime,
        final: Mapping[str, object] | None,
        message: str,
        cause: FailureCause | None = None,
        space: Space | None = None,
    ) -> Event | None:
        """The event that reports a shard's end; None when it was revoked (its job already ended).

        ``final`` is the shard's last report: ``finished`` (after a normal end), ``preempted`` (after a stop) or
        ``failed`` (why, beside the exit code); ``space`` the free space of its output disk as it exited.
        """
        revoked = self.states.get(key) is ShardAttempt.REVOKED
        if not self._move(key, ShardAttempt.ENDED):
            raise NotRunning(key)
        assignment = self.assignments.pop(key)
        self.utilization.pop(key, None)
        self.sync_intervals.pop(key, None)
        fenced = self.fenced.pop(key, None)
        gpu_fault = self.gpu_faulted.pop(key, None)
        if revoked:
            return None
        with contextlib.suppress(SecretEnvError):  # refused at launch, then: no value of it reached the shard
            assignment = opened_env(assignment, self.env_key)
        return reports.ended(
            self.node_id,
            key,
            assignment,
            returncode,
            now=now,
            final=final or {},
            message=message,
            cause=cause,
            fenced=fenced,
            gpu_fault=gpu_fault,
            space=space,
        )
