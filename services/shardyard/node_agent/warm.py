"""Which warm standbys (:mod:`shardyard.training.standby`) the agent keeps, and which one a launch takes. Pure: the
agent starts and ends the processes, time comes in.

A standby is started for a job when a shard of it is likely to start here soon (see :data:`Mode`): for each spare
the node holds for the job; when a shard of the job ended here with a failure its gang recovers from; and, in
``gang`` mode, for each shard of a multi-shard job training here, once it has trained a few seconds (so that the
whole gang, survivors included, re-forms warm after a member's loss). It lives while the job holds a spare or runs
a shard here, else ``ttl_s`` from its start; the job's end ends it at once. The node keeps at most ``limit`` (its GPU
count: never more warm processes than shards it could run).

:class:`StandbyPolicy` says when a job is worth one more; :class:`WarmBook` keeps the standbys and gives them out.
"""

from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Final, Generic, Literal, TypeVar

from shardyard.events import Event, FailureCause, ShardAssignment, ShardFailed
from shardyard.node_agent.book import ShardKey

Mode = Literal["none", "spares", "gang"]
"""``none``: every shard starts cold. ``spares``: a standby per spare held and after a recoverable failure. ``gang``:
also one per training shard of a multi-shard job (an idle interpreter with torch imported, some 240 MB of host
memory each)."""

DEFAULT_TTL_S: Final = 60.0
DEFAULT_GANG_AFTER_S: Final = 5.0
"""``gang`` mode starts a shard's standby once it has trained this long: its own start no longer competes with the
standby's imports, and short runs (quick experiments, most of a test suite's jobs) never pay for one."""

WARM_AFTER: Final = frozenset(
    {
        FailureCause.PROCESS_EXIT,
        FailureCause.KILLED,
        FailureCause.COMM_ERROR,
        FailureCause.SYNC_TIMEOUT,
        FailureCause.FENCED,
    }
)
"""Failures after which the gang is re-formed, most likely with a member on this node again. The causes that keep
the recovery off this node (OOM, GPU fault, launch error) or end the job (user error, missing artifact) are not."""

S = TypeVar("S")


@dataclass
class Warm(Generic[S]):
    job_id: str
    standby: S
    started_at: float
    """monotonic seconds"""


@dataclass
class WarmBook(Generic[S]):
    limit: int
    ttl_s: float = DEFAULT_TTL_S
    idle: list[Warm[S]] = field(default_factory=list)
    starting: Counter[str] = field(default_factory=Counter)
    """Standbys being started, by job: they count already."""

    def room(self) -> bool:
        return len(self.idle) + self.starting.total() < self.limit

    def count(self, job_id: str) -> int:
        """The job's standbys, idle or being started."""
        return sum(1 for w in self.idle if w.job_id == job_id) + self.starting[job_id]

    def reserve(self, job_id: str) -> None:
        """A standby of the job is being started: it takes its room now."""
        self.starting[job_id] += 1

    def unreserve(self, job_id: str) -> None:
        """The standby being started is up (and added) or failed to start."""
        self.starting[job_id] -= 1
        if not self.starting[job_id]:
            del self.starting[job_id]

    def add(self, job_id: str, standby: S, *, now: float) -> None:
        self.idle.append(Warm(job_id, standby, now))

    def take(self, job_id: str) -> S | None:
        """The job's oldest standby (the one most likely done warming up), now no longer idle."""
        for i, warm in enumerate(self.idle):
            if warm.job_id == job_id:
                del self.idle[i]
                return warm.standby
        return None

    def expired(self, now: float, holding: Collection[str]) -> list[S]:
        """Standbys past their time, now forgotten: those of jobs that hold no spare and run no shard here
        (``holding``), started ``ttl_s`` or more ago."""
        keep: list[Warm[S]] = []
        gone: list[S] = []
        for warm in self.idle:
            if warm.job_id not in holding and now - warm.started_at >= self.ttl_s:
                gone.append(warm.standby)
            else:
                keep.append(warm)
        self.idle = keep
        return gone

    def dead(self, alive: Callable[[S], bool]) -> list[S]:
        """Standbys that ended by themselves (a failed import, a signal), now forgotten: they hold no room."""
        gone = [w.standby for w in self.idle if not alive(w.standby)]
        self.idle = [w for w in self.idle if alive(w.standby)]
        return gone

    def ended(self, job_id: str) -> list[S]:
        """The job ended: its standbys, now forgotten."""
        gone = [w.standby for w in self.idle if w.job_id == job_id]
        self.idle = [w for w in self.idle if w.job_id != job_id]
        return gone

    def clear(self) -> list[S]:
        gone = [w.standby for w in self.idle]
        self.idle = []
        return gone


def _runner(assignment: ShardAssignment) -> bool:
    """A standby is the built-in runner, warmed up: a job's own entrypoint cannot use one."""
    return assignment.workload.entrypoint is None


@dataclass
class StandbyPolicy:
    """When a job is worth one more standby here. The caller says what it has (``have``: the job's standbys, idle
    or starting) and what runs here; time comes in."""

    mode: Mode = "gang"
    gang_after_s: float = DEFAULT_GANG_AFTER_S
    due: dict[ShardKey, float] = field(default_factory=dict)
    """``gang`` mode: training shards without their standby yet -> when it is due (monotonic seconds)."""
    members: dict[str, int] = field(default_factory=dict)
    """Job -> the most shards of it that ran here at once (as many standbys are worth keeping after a failure)."""

    def for_spare(self, assignment: ShardAssignment) -> bool:
        """A spare is held here: its promotion would start a shard."""
        return self.mode != "none" and _runner(assignment)

    def launched(self, job_id: str, *, here: int) -> None:
        """A shard of the job started; ``here`` of its shards run here now."""
        self.members[job_id] = max(self.members.get(job_id, 0), here)

    def trained(
        self, key: ShardKey, assignment: ShardAssignment | None, *, first: bool, now: float, here: int, have: int
    ) -> bool:
        """A progress report of a running shard (``first``: its first). ``gang`` mode: a shard of a multi-shard job
        that trained ``gang_after_s`` is worth one, once, while its job has fewer than the ``here`` shards it runs."""
        if self.mode != "gang" or assignment is None or not _runner(assignment) or assignment.world_size < 2:
            return False
        if first:
            self.due[key] = now + self.gang_after_s
        due = self.due.get(key)
        if due is None or now < due:
            return False
        del self.due[key]
        return have < here

    def ended(self, key: ShardKey, assignment: ShardAssignment | None, event: Event | None, *, have: int) -> bool:
        """A shard ended, reported with ``event``. A failure its gang recovers from (:data:`WARM_AFTER`) re-forms the
        gang, most likely with as many members here again: worth one while the job has fewer than that."""
        self.due.pop(key, None)
        if self.mode == "none" or assignment is None or not _runner(assignment):
            return False
        if not (isinstance(event, ShardFailed) and event.cause in WARM_AFTER):
            return False
        return have < self.members.get(key[0], 1)

    def job_ended(self, job_id: str) -> None:
        self.members.pop(job_id, None)
