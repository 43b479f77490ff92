"""The discrete-event loop, in simulated time (integer microseconds): no clock, no sleeping.

Events are job arrivals, gang completions, releases after a preemption and degraded-wait expiries. After every
event of one instant, one scheduling cycle asks the policy for actions on the current state and applies them:

- ``Start``: the gang takes its GPUs now and runs ``remaining work / speed``, where ``speed`` is the lowest match
  score (node TFLOPS / the job's ``min_tflops``, at most 1) among its nodes: 1 on full-match GPUs. After a
  preemption it first restarts (``WorkModel.restart_s``, no progress).
- ``Stop`` (preemption): the gang gets a notice; it checkpoints on it, or runs on to the deadline and loses the work
  since its last periodic checkpoint (``sim.lost_work``); then it releases its GPUs and is pending again with the
  work it kept. A gang that would finish before its release finishes instead.

A degraded-wait expiry (``ready + max_wait_s`` of a job with ``min_match``) is an event of its own: the real
scheduler cycles every second, so a job whose degraded floor starts to apply is seen then, not at the next arrival.
"""

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from shardyard.errors import ShardyardError
from shardyard.gpus import match_score
from shardyard.quotas import DEFAULT_QUEUE
from shardyard.sim.cluster import NodeSpec
from shardyard.sim.fairness import Entitlements, ShareLog
from shardyard.sim.lost_work import US, Attempt, Spent, Stopping, WorkModel, finished, preempted, stop, to_us
from shardyard.sim.trace import TraceJob

Shards = tuple[tuple[str, tuple[int, ...]], ...]
"""(node id, GPU indices) per node of a gang."""
GroupKey = tuple[str, float]
"""(GPU model, TFLOPS): nodes that are interchangeable for every filter."""


class SimulationError(ShardyardError):
    """A policy asked for something the simulated cluster cannot do (a bug in the policy, not in the trace)."""


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


Action = Start | Stop


@dataclass
class Waiting:
    """A pending job."""

    job: TraceJob
    order: int
    """Position in submission order (submit time, then trace order): FIFO order."""
    ready_us: int
    """Submission, or the end of the checkpoint after a preemption."""
    remaining_s: float
    """Work left, in seconds on full-match GPUs."""


@dataclass
class Gang:
    """A job holding GPUs."""

    job: TraceJob
    shards: Shards
    started_us: int
    speed: float
    remaining_s: float
    """Work left when it started."""
    finish_us: int
    attempt: int
    times: Attempt
    """Its restart and periodic checkpoints (``lost_work``)."""
    preempted_by: str | None = None
    """Set once a policy stopped it for that job."""
    stopping: Stopping | None = None
    """Its notice, release and the work it keeps (None: running, or finishing before its release would)."""


class State:
    """What a policy reads in a cycle. Policies must not change it: they return actions."""

    def __init__(self, nodes: Sequence[NodeSpec], work: WorkModel | None = None) -> None:
        self.nodes = tuple(nodes)
        self.work = work or WorkModel()
        """How gangs checkpoint, take notice and restart: a policy reads the restart cost of a preemption here."""
        self.by_id = {node.node_id: node for node in self.nodes}
        self.free: dict[str, tuple[int, ...]] = {node.node_id: tuple(range(node.gpus)) for node in self.nodes}
        """Node id -> free GPU indices, ascending."""
        self.group_free: dict[GroupKey, int] = {}
        for node in self.nodes:
            key = (node.gpu_model, node.tflops)
            self.group_free[key] = self.group_free.get(key, 0) + node.gpus
        self.pending: dict[str, Waiting] = {}
        self.running: dict[str, Gang] = {}
        self.changed: dict[str, None] = dict.fromkeys(node.node_id for node in self.nodes)
        """Nodes whose free GPUs changed since a policy last emptied this (all, at first), in the order they
        changed (a set's order would change from run to run): a policy that keeps its own index up to date reads
        it instead of every node."""
        self.gangs_changed: dict[str, None] = {}
        """Jobs whose gang started, stopped or was told to stop since a policy last emptied this: a policy that
        keeps its own view of the gangs reads it instead of every gang."""
        self._eligible: dict[tuple[str | None, float], tuple[tuple[GroupKey, ...], tuple[NodeSpec, ...], int]] = {}

    def eligible(self, job: TraceJob) -> tuple[tuple[GroupKey, ...], tuple[NodeSpec, ...], int]:
        """The groups and nodes (declaration order) of a full match for ``job`` and their GPUs in all."""
        key = (job.gpu_model, job.min_tflops)
        known = self._eligible.get(key)
        if known is None:
            nodes = tuple(
                node
                for node in self.nodes
                if (job.gpu_model is None or node.gpu_model == job.gpu_model) and node.tflops >= job.min_tflops
            )
            groups = tuple(dict.fromkeys((node.gpu_model, node.tflops) for node in nodes))
            known = self._eligible[key] = (groups, nodes, sum(node.gpus for node in nodes))
        return known

    def take(self, node_id: str, gpus: tuple[int, ...]) -> None:
        free = self.free[node_id]
        if not set(gpus) <= set(free) or len(set(gpus)) != len(gpus):
            raise SimulationError(f"GPUs {gpus} of {node_id} are not free (free: {free})")
        self.free[node_id] = tuple(g for g in free if g not in gpus)
        self.changed[node_id] = None
        node = self.by_id[node_id]
        self.group_free[(node.gpu_model, node.tflops)] -= len(gpus)

    def give_back(self, node_id: str, gpus: tuple[int, ...]) -> None:
        self.free[node_id] = tuple(sorted((*self.free[node_id], *gpus)))
        self.changed[node_id] = None
        node = self.by_id[node_id]
        self.group_free[(node.gpu_model, node.tflops)] += len(gpus)


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
            if changed and self.state.pending:
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
        if gang is None or gang.attempt != attempt:
            return False
        outcome = self._outcomes[job_id]
        if kind is _Kind.FINISH:
            if gang.stopping is not None:
                return False  # it was preempted: its release comes first
            self._free(gang, now)
            self._account(outcome, finished(gang.times, now))
            outcome.finish_us = now
            return True
        # RELEASE: the gang stops and waits again with the work it kept.
        stopping = gang.stopping
        assert stopping is not None
        self._free(gang, now)
        self._account(outcome, preempted(gang.times, stopping))
        done = (stopping.kept_us - gang.times.progress_us) / US * gang.speed
        outcome.preemptions += 1
        self._preemptions += 1
        self._enqueue(gang.job, now, max(0.0, gang.remaining_s - done))
        return True

    def _account(self, outcome: Outcome, spent: Spent) -> None:
        outcome.productive_us += spent.productive
        self._spent.add(spent, outcome.job.gpus)

    def _enqueue(self, job: TraceJob, now: int, remaining_s: float) -> None:
        self.state.pending[job.job_id] = Waiting(job, self._orders[job.job_id], now, remaining_s)
        if self.shares is not None:
            self.shares.ask(job.queue or DEFAULT_QUEUE, job.gpu_model, job.gpus)
        if job.min_match is not None and job.max_wait_s > 0:
            self._push(now + to_us(job.max_wait_s), _Kind.WAKE, job.job_id)

    def _free(self, gang: Gang, now: int) -> None:
        del self.state.running[gang.job.job_id]
        self.state.gangs_changed[gang.job.job_id] = None
        for node_id, gpus in gang.shards:
            self.state.give_back(node_id, gpus)
        if self.shares is not None:
            self._hold(gang.job, gang.shards, -1)
        self._busy_us += (now - gang.started_us) * gang.job.gpus
        self._hold_gpus(now, -gang.job.gpus)

    def _hold_gpus(self, now: int, gpus: int) -> None:
        """Count ``gpus`` more (fewer, below 0) GPUs held from ``now`` on: one sample per instant."""
        self._held += gpus
        samples = self._busy_gpus
        if samples and samples[-1][0] == now:
            samples[-1] = (now, self._held)
        else:
            samples.append((now, self._held))

    # --- decisions: one cycle -----------------------------------------------------------------------------------
    def _cycle(self, now: int) -> None:
        self._cycles += 1
        for action in self.policy(self.state, now):
            if isinstance(action, Start):
                self._start(action, now)
            else:
                self._stop(action, now)

    def _start(self, action: Start, now: int) -> None:
        state = self.state
        waiting = state.pending.pop(action.job_id, None)
        if waiting is None:
            raise SimulationError(f"policy started {action.job_id!r}, which is not pending")
        job = waiting.job
        if sum(len(gpus) for _node, gpus in action.shards) != job.gpus:
            raise SimulationError(f"policy gave {action.job_id!r} {action.shards}, not {job.gpus} GPUs")
        for node_id, gpus in action.shards:
            if node_id not in state.by_id:
                raise SimulationError(f"policy placed {action.job_id!r} on unknown node {node_id!r}")
            state.take(node_id, gpus)
        speed = min(match_score(state.by_id[node_id].tflops, job.min_tflops) for node_id, _gpus in action.shards)
        outcome = self._outcomes[job.job_id]
        attempt = outcome.preemptions + 1
        every = job.checkpoint_every_s or self.work.checkpoint_every_s
        times = Attempt(now, to_us(self.work.restart_s) if outcome.preemptions else 0, to_us(every))
        finish = times.progress_us + to_us(waiting.remaining_s / speed)
        state.running[job.job_id] = Gang(job, action.shards, now, speed, waiting.remaining_s, finish, attempt, times)
        if self.shares is not None:
            self.shares.ask(job.queue or DEFAULT_QUEUE, job.gpu_model, -job.gpus)
            self._hold(job, action.shards, 1)
        state.gangs_changed[job.job_id] = None
        if outcome.first_start_us is None:
            outcome.first_start_us = now
        self._degraded += action.degraded
        self._hold_gpus(now, job.gpus)
        self._push(finish, _Kind.FINISH, job.job_id, attempt)

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
        self._push(stopping.release_us, _Kind.RELEASE, action.job_id, gang.attempt)


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
