"""The discrete-event loop, in simulated time (integer microseconds): no clock, no sleeping.

Events are job arrivals, gang completions, releases after a preemption and degraded-wait expiries. After every
event of one instant, one scheduling cycle asks the policy for actions on the current state and applies them:

- ``Start``: the gang takes its GPUs now and runs ``remaining work / speed``, where ``speed`` is the lowest match
  score (node TFLOPS / the job's ``min_tflops``, at most 1) among its nodes: 1 on full-match GPUs. After a
  preemption it first restarts (``WorkModel.restart_s``, no progress).
- ``Stop`` (preemption): the gang gets a notice; it checkpoints on it, or runs on to the deadline and loses the work
  since its last periodic checkpoint (``sim.lost_work``); then it releases its GPUs and is pending again with the
  work it kept. A gang that would finish before its release finishes instead.

- ``Resize`` (elastic jobs, ``sim.gang``): the gang re-forms on its new set of GPUs, taking and giving back the
  difference now; its work so far is kept, and its finish planned again at its new rate after the resize time.

A degraded-wait expiry (``ready + max_wait_s`` of a job with ``min_match``) is an event of its own: the real
scheduler cycles every second, so a job whose degraded floor starts to apply is seen then, not at the next arrival.
"""

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from shardyard.gpus import match_score
from shardyard.quotas import DEFAULT_QUEUE
from shardyard.sim.cluster import NodeSpec
from shardyard.sim.fairness import Entitlements, ShareLog
from shardyard.sim.gang import Gang, Shards, gpu_count
from shardyard.sim.lost_work import US, Attempt, Spent, WorkModel, stop, to_us
from shardyard.sim.state import GroupKey, SimulationError, State, Waiting
from shardyard.sim.trace import TraceJob

__all__ = [
    "US",
    "Action",
    "Gang",
    "GroupKey",
    "Outcome",
    "PolicyFn",
    "Resize",
    "Shards",
    "SimResult",
    "Simulation",
    "SimulationError",
    "Start",
    "State",
    "Stop",
    "Waiting",
    "simulate",
    "to_us",
]


@dataclass(frozen=True)
class Start:
    job_id: str
    shards: Shards
    degraded: bool = False


@dataclass(frozen=True)
class Stop:
    """Checkpoint and requeue ``job_id`` so that ``by_job`` can fit."""

    job_id: str
    by_job: str


@dataclass(frozen=True)
class Resize:
    """Re-form the running elastic gang of ``job_id`` on ``shards``, its whole new set of GPUs."""

    job_id: str
    shards: Shards


Action = Start | Stop | Resize


PolicyFn = Callable[[State, int], Sequence[Action]]
"""``(state, now_us) -> actions``: one scheduling cycle."""


@dataclass
class Outcome:
    job: TraceJob
    first_start_us: int | None = None
    finish_us: int | None = None
    preemptions: int = 0
    productive_us: int = 0
    """Run time that advanced work not done before (``lost_work.Spent.productive``), over its attempts."""


@dataclass(frozen=True)
class SimResult:
    policy: str
    outcomes: tuple[Outcome, ...]
    total_gpus: int
    busy_gpu_s: float
    """GPU-seconds held by gangs (checkpointing included)."""
    spent: Spent
    """GPU-microseconds held by gangs, by part: productive, and lost to preemption (restart, recomputed, stopping)."""
    preemptions: int
    degraded_placements: int
    cycles: int
    shares: dict[str, float] = field(default_factory=dict)
    """Per queue with an entitlement, its share of it while it had jobs waiting (``sim.fairness``); empty: none
    given."""
    busy_gpus: tuple[tuple[int, int], ...] = ()
    """(simulated microseconds, GPUs held by gangs from then on) at each instant a gang took or gave back GPUs, in
    time order (checkpointing counts as held, as in ``busy_gpu_s``); none held before the first."""
    resizes: int = 0
    """Re-formations of elastic gangs at a new size (one per gang and instant)."""


PLANS = 1 << 32
"""An event's ``attempt`` is the gang's attempt x PLANS + its finish plan (``Gang.version``): one of an attempt
stopped or of a plan replaced by a resize is stale."""


class _Kind(IntEnum):
    ARRIVE = 0
    FINISH = 1
    RELEASE = 2
    WAKE = 3


class Simulation:
    """One replay of a trace under one policy."""

    def __init__(
        self,
        trace: Sequence[TraceJob],
        nodes: Sequence[NodeSpec],
        policy: PolicyFn,
        work: WorkModel | None = None,
        owed: Entitlements | None = None,
    ) -> None:
        self.state = State(nodes, work)
        self.work = self.state.work
        self.shares = ShareLog(owed) if owed is not None else None
        """Each queue's share of its entitlement ``owed``, as the run goes (None: none given)."""
        self.policy = policy
        self._spent = Spent()
        self._events: list[tuple[int, int, _Kind, str, int]] = []
        self._seq = 0
        self._outcomes: dict[str, Outcome] = {}
        self._orders: dict[str, int] = {}
        self._busy_us = 0
        self._held = 0
        self._busy_gpus: list[tuple[int, int]] = []
        self._preemptions = 0
        self._degraded = 0
        self._cycles = 0
        self._resizes = 0
        ordered = sorted(enumerate(trace), key=lambda item: (item[1].submit_s, item[0]))
        for order, (_position, job) in enumerate(ordered):
            if job.job_id in self._outcomes:
                raise SimulationError(f"job id {job.job_id!r} appears twice in the trace")
            self._outcomes[job.job_id] = Outcome(job)
            self._orders[job.job_id] = order
            self._push(to_us(job.submit_s), _Kind.ARRIVE, job.job_id)

    def _push(self, at_us: int, kind: _Kind, job_id: str, attempt: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at_us, self._seq, kind, job_id, attempt))

    def run(self, name: str) -> SimResult:
        events = self._events
        while events:
            now = events[0][0]
            if self.shares is not None:
                self.shares.advance(now)  # the time since the last instant, as that instant left the cluster
            changed = False
            while events and events[0][0] == now:
                _at, _seq, kind, job_id, attempt = heapq.heappop(events)
                changed = self._apply(kind, job_id, attempt, now) or changed
            if changed and (self.state.pending or self._growable()):
                self._cycle(now)
        return SimResult(
            policy=name,
            outcomes=tuple(self._outcomes.values()),
            total_gpus=sum(node.gpus for node in self.state.nodes),
            busy_gpu_s=self._busy_us / US,
            spent=self._spent,
            preemptions=self._preemptions,
            degraded_placements=self._degraded,
            cycles=self._cycles,
            shares={} if self.shares is None else self.shares.shares(_queues(self._outcomes.values())),
            busy_gpus=tuple(self._busy_gpus),
            resizes=self._resizes,
        )

    # --- facts: what happened at ``now`` -----------------------------------------------------------------------
    def _apply(self, kind: _Kind, job_id: str, attempt: int, now: int) -> bool:
        """Apply one event; False when it changes nothing (its gang was stopped, or its wait was reset)."""
        state = self.state
        if kind is _Kind.ARRIVE:
            outcome = self._outcomes[job_id]
            self._enqueue(outcome.job, now, outcome.job.duration_s)
            return True
        if kind is _Kind.WAKE:
            waiting = state.pending.get(job_id)
            return waiting is not None and waiting.ready_us + to_us(waiting.job.max_wait_s) == now
        gang = state.running.get(job_id)
        if gang is None or (gang.attempt, gang.version) != divmod(attempt, PLANS):
            return False
        outcome = self._outcomes[job_id]
        if kind is _Kind.FINISH:
            if gang.stopping is not None:
                return False  # it was preempted: its release comes first
            self._free(gang, now)
            self._account(outcome, *gang.finished(now))
            outcome.finish_us = now
            return True
        # RELEASE: the gang stops and waits again with the work it kept.
        stopping = gang.stopping
        assert stopping is not None
        self._free(gang, now)
        self._account(outcome, *gang.preempted(stopping))
        outcome.preemptions += 1
        self._preemptions += 1
        self._enqueue(gang.job, now, max(0.0, gang.spans[0].remaining_s - gang.work_s(stopping.kept_us)))
        return True

    def _account(self, outcome: Outcome, spent: Spent, productive_us: int) -> None:
        """``spent``: GPU-weighted; ``productive_us``: the gang's productive run time."""
        outcome.productive_us += productive_us
        self._spent.add(spent)

    def _enqueue(self, job: TraceJob, now: int, remaining_s: float) -> None:
        self.state.pending[job.job_id] = Waiting(job, self._orders[job.job_id], now, remaining_s)
        if self.shares is not None:
            self.shares.ask(job.queue or DEFAULT_QUEUE, job.gpu_model, job.gpus)
        if job.min_match is not None and job.max_wait_s > 0:
            self._push(now + to_us(job.max_wait_s), _Kind.WAKE, job.job_id)

    def _free(self, gang: Gang, now: int) -> None:
        del self.state.running[gang.job.job_id]
        self.state.elastic.pop(gang.job.job_id, None)
        self.state.gangs_changed[gang.job.job_id] = None
        for node_id, gpus in gang.shards:
            self.state.give_back(node_id, gpus)
        if self.shares is not None:
            self._hold(gang.job, gang.shards, -1)
        self._busy_us += gang.gpu_us(gang.started_us, now)
        self._hold_gpus(now, -gang.gpus)

    def _hold_gpus(self, now: int, gpus: int) -> None:
        """Count ``gpus`` more (fewer, below 0) GPUs held from ``now`` on: one sample per instant."""
        self._held += gpus
        samples = self._busy_gpus
        if samples and samples[-1][0] == now:
            samples[-1] = (now, self._held)
        else:
            samples.append((now, self._held))

    # --- decisions: one cycle -----------------------------------------------------------------------------------
    def _growable(self) -> bool:
        """Whether an elastic gang could grow (below its ``max_shards``, not stopping): a cycle may grow it."""
        running = self.state.running
        for job_id in self.state.elastic:
            gang = running[job_id]
            if gang.preempted_by is None and gang.gpus < (gang.job.max_shards or 0):
                return True
        return False

    def _cycle(self, now: int) -> None:
        """Ask the policy and apply its actions; ask again at once (at most twice more) after a batch that shrank
        a gang while jobs wait (the GPUs it gave back are free for them now), or that started an elastic gang with
        nothing left waiting (it may grow into what is left)."""
        for _ask in range(3):
            self._cycles += 1
            again = False
            for action in self.policy(self.state, now):
                if isinstance(action, Start):
                    self._start(action, now)
                    again = again or (action.job_id in self.state.elastic and not self.state.pending)
                elif isinstance(action, Stop):
                    self._stop(action, now)
                else:
                    again = self._resize(action, now) or again
            if not again or not (self.state.pending or self._growable()):
                return

    def _start(self, action: Start, now: int) -> None:
        state = self.state
        waiting = state.pending.pop(action.job_id, None)
        if waiting is None:
            raise SimulationError(f"policy started {action.job_id!r}, which is not pending")
        job = waiting.job
        gpus = gpu_count(action.shards)
        low, high = (job.gpus, job.gpus) if job.min_shards is None else (job.min_shards, job.max_shards or job.gpus)
        if not low <= gpus <= high:
            sizes = f"{job.gpus}" if low == high else f"{low}..{high}"
            raise SimulationError(f"policy gave {action.job_id!r} {action.shards}, not {sizes} GPUs")
        self._take(action.job_id, action.shards)
        outcome = self._outcomes[job.job_id]
        attempt = outcome.preemptions + 1
        every = job.checkpoint_every_s or self.work.checkpoint_every_s
        times = Attempt(now, to_us(self.work.restart_s) if outcome.preemptions else 0, to_us(every))
        gang = Gang.start(job, action.shards, now, self._speed(job, action.shards), waiting.remaining_s, attempt, times)
        state.running[job.job_id] = gang
        if job.min_shards is not None:
            state.elastic[job.job_id] = None
        if self.shares is not None:
            self.shares.ask(job.queue or DEFAULT_QUEUE, job.gpu_model, -job.gpus)
            self._hold(job, action.shards, 1)
        state.gangs_changed[job.job_id] = None
        if outcome.first_start_us is None:
            outcome.first_start_us = now
        self._degraded += action.degraded
        self._hold_gpus(now, gpus)
        self._push(gang.finish_us, _Kind.FINISH, job.job_id, attempt * PLANS)

    def _take(self, job_id: str, shards: Shards) -> None:
        for node_id, gpus in shards:
            if node_id not in self.state.by_id:
                raise SimulationError(f"policy placed {job_id!r} on unknown node {node_id!r}")
            self.state.take(node_id, gpus)

    def _speed(self, job: TraceJob, shards: Shards) -> float:
        return min(match_score(self.state.by_id[node_id].tflops, job.min_tflops) for node_id, _gpus in shards)

    def _resize(self, action: Resize, now: int) -> bool:
        """Re-form an elastic gang on ``action.shards``; True when it gave GPUs back."""
        state = self.state
        gang = state.running.get(action.job_id)
        job = None if gang is None else gang.job
        if gang is None or job is None or job.min_shards is None or gang.preempted_by is not None:
            raise SimulationError(f"policy resized {action.job_id!r}, which is no running elastic gang")
        gpus = gpu_count(action.shards)
        if not job.min_shards <= gpus <= (job.max_shards or job.gpus):
            sizes = f"{job.min_shards}..{job.max_shards}"
            raise SimulationError(f"policy resized {action.job_id!r} to {gpus} GPUs, not {sizes}")
        before = {node_id: set(held) for node_id, held in gang.shards}
        after = {node_id: set(held) for node_id, held in action.shards}
        for node_id, held in before.items():
            released = tuple(sorted(held - after.get(node_id, set())))
            if released:
                state.give_back(node_id, released)
        self._take(action.job_id, tuple((n, tuple(sorted(h - before.get(n, set())))) for n, h in after.items()))
        if self.shares is not None:
            self._hold(job, gang.shards, -1)
            self._hold(job, action.shards, 1)
        held_before = gang.gpus
        self._resizes += gang.resize(now, action.shards, self._speed(job, action.shards), to_us(self.work.resize_s))
        state.gangs_changed[job.job_id] = None
        self._hold_gpus(now, gpus - held_before)
        self._push(gang.finish_us, _Kind.FINISH, job.job_id, gang.attempt * PLANS + gang.version)
        return gpus < held_before

    def _hold(self, job: TraceJob, shards: Shards, sign: int) -> None:
        assert self.shares is not None
        for node_id, gpus in shards:
            self.shares.hold(job.queue or DEFAULT_QUEUE, self.state.by_id[node_id].gpu_model, sign * len(gpus))

    def _stop(self, action: Stop, now: int) -> None:
        gang = self.state.running.get(action.job_id)
        if gang is None or gang.preempted_by is not None:
            raise SimulationError(f"policy preempted {action.job_id!r}, which is not running or already stopping")
        gang.preempted_by = action.by_job
        self.state.gangs_changed[action.job_id] = None
        stopping = stop(self.work, gang.times, gang.job.job_id, now)
        if gang.finish_us <= stopping.release_us:
            return  # it ends before it would give its GPUs back: it finishes
        gang.stopping = stopping
        self._push(stopping.release_us, _Kind.RELEASE, action.job_id, gang.attempt * PLANS + gang.version)


def simulate(
    trace: Sequence[TraceJob],
    nodes: Sequence[NodeSpec],
    policy: PolicyFn,
    *,
    name: str,
    work: WorkModel | None = None,
    owed: Entitlements | None = None,
) -> SimResult:
    """Replay ``trace`` on ``nodes`` with ``policy`` deciding every cycle, gangs checkpointing, taking notice and
    restarting as ``work`` says (default ``WorkModel()``); with ``owed`` (each queue's entitlement,
    ``sim.fairness``), measure each queue's share of it."""
    return Simulation(trace, nodes, policy, work, owed).run(name)


def _queues(outcomes: Iterable[Outcome]) -> list[str]:
    return sorted({outcome.job.queue or DEFAULT_QUEUE for outcome in outcomes})
