"""The policies the simulator compares, by name.

``shardyard`` is not a model of Shardyard: ``CorePolicy`` builds the same frozen ``Snapshot`` the scheduler service
builds and calls the same pure function, ``shardyard.placement.cycle.schedule``; it only translates the
decisions (Place -> ``Start``, Preempt -> ``Stop``, Unschedulable -> nothing). It tells the core what the
scheduler service tells it: each job's attained service, and its expected run time, declared by the trace
(``expected_duration_s``) or learned from the jobs that ended (``shardyard.placement.estimates``), never the
trace's true ``duration_s``. ``fifo``, ``priority``, ``first-fit`` and the ``sjf-oracle`` reference are the plain
policies of ``shardyard.sim.baselines``. ``shardyard-order`` is the core taking its victims in the victim order
(``Policy(victims="order")``) instead of by the work they would lose; ``shardyard-one-queue`` is the core without
the queues' quotas.

The core chooses victims by what they would lose (``RunningJob.lost_gpu_s``): it is told each gang's last periodic
checkpoint in its attempt and the restart cost of a preemption (``sim.lost_work``), as the scheduler hears of them;
not whether a job's code checkpoints on notice.

Elastic jobs (a trace's ``min_shards``/``max_shards``): every ``CorePolicy`` (``shardyard``, ``shardyard-order``,
``shardyard-one-queue``) tells the core a job's sizes (``JobSpec.elasticity``), so it starts one smaller when its
preferred size does not fit, and grows and shrinks the gangs beside the core (``sim.elastic``): a cycle with a
surplus to give back while jobs wait returns only those shrinks (the engine applies them and asks again at the same
instant, so the core sees those GPUs free before it weighs preemption), and one that leaves no job waiting grows
the gangs into what is left. The baselines run every job rigid, at its preferred size.

Every simulated node holds the jobs' model and dataset on a shared path, has ample memory and CPU for its GPUs and
no CPU load, so GPUs are the binding resource.
"""

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from shardyard.errors import ConfigError
from shardyard.events import JobSpec, NodeStatus
from shardyard.events.job import Elasticity
from shardyard.placement.calibration import StartCalibration
from shardyard.placement.cycle import schedule
from shardyard.placement.estimates import DurationEstimates, EstimateKey
from shardyard.placement.model import NodeView, PendingJob, Place, Policy, Preempt, RunningJob, Snapshot
from shardyard.placement.standing import StandingIndex
from shardyard.quotas import DEFAULT_QUEUE, QueuesConfig
from shardyard.sim.baselines import fifo, first_fit, priority_first, sjf_oracle
from shardyard.sim.cluster import NodeSpec
from shardyard.sim.defaults import ONE_QUEUE, ORDER_VICTIMS, POLICY_NAMES
from shardyard.sim.elastic import grows, shrinks
from shardyard.sim.engine import Action, Gang, PolicyFn, Start, State, Stop, Waiting, to_us
from shardyard.sim.start_audit import StartAudit
from shardyard.sim.trace import TraceJob

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
"""Simulated time 0 as the core's datetimes (any fixed instant: only differences matter)."""
GIB = 1024**3
SHARD_MEMORY = GIB
SHARD_CPU = 1.0
NODE_MEMORY_PER_GPU = 64 * GIB
NODE_CPU_PER_GPU = 16.0
MODEL_PATH = "/sim/models/model"
DATASET_PATH = "/sim/datasets/dataset"
ARTIFACTS: Mapping[str, str] = MappingProxyType({MODEL_PATH: "shared", DATASET_PATH: "shared"})
FIRST_PORT = 29500


def at(now_us: int) -> datetime:
    return EPOCH + timedelta(microseconds=now_us)


class CorePolicy:
    """Shardyard's placement core, called once per cycle on a snapshot of the simulated cluster."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        policy: Policy | None = None,
        estimates: DurationEstimates | None = None,
        quotas: QueuesConfig | None = None,
        audit: StartAudit | None = None,
    ) -> None:
        self.nodes = tuple(nodes)
        self.quotas = quotas
        """The queues (``--queues-file``): quotas, borrowing, fair share and reclaim, as the scheduler applies them."""
        # Start estimates cost a plan per cycle: made only in the cycles ``audit`` asks for (none without one).
        self.policy = replace(policy or Policy(), start_estimates=0)
        self.estimating = policy or Policy()
        self.audit = audit
        self.calibration = StartCalibration()
        """The estimates' correction, learned from the starts that followed them (as the scheduler learns it)."""
        self.estimates = estimates if estimates is not None else DurationEstimates()
        """Run times learned from the jobs that ended, for jobs that declare none."""
        self._views: dict[str, NodeView] = {}
        self._specs: dict[str, JobSpec] = {}
        self._pending: dict[str, tuple[int, PendingJob]] = {}
        """Job id -> (ready time, the job as the core sees it)."""
        self._running: dict[str, tuple[int, int | None, int, RunningJob]] = {}
        """Job id -> (start time, last periodic checkpoint, finish plan, the gang as the core sees it)."""
        self._due: list[tuple[int, str]] = []
        """(next periodic checkpoint, job id) of the running gangs: a heap, so a cycle looks again only at the gangs
        that wrote a checkpoint since the last."""
        self._jobs: dict[str, TraceJob] = {}
        """Job id -> the trace job, while it is pending or running."""
        self._index: StandingIndex | None = None
        self._gangs: dict[str, RunningJob] = {}
        """Job id -> its gang as the core sees it, in the order the gangs started (the simulation's)."""
        self._gangs_on: dict[str, list[RunningJob]] = {}
        """Node id -> the gangs there, in the order they started (``Snapshot.gangs_on``)."""

    def __call__(self, state: State, now_us: int) -> list[Action]:
        given_back = shrinks(state)
        if given_back:
            return list(given_back)  # the engine applies them and asks again: the core then sees those GPUs free
        actions = self._decide(state, now_us) if state.pending else []
        return [*actions, *grows(state, actions)]

    def _decide(self, state: State, now_us: int) -> list[Action]:
        """The core's decisions for this cycle, as actions."""
        changed = list(state.gangs_changed)
        state.gangs_changed.clear()
        self._learn(state, changed)
        due = self._due
        while due and due[0][0] <= now_us:
            job_id = heapq.heappop(due)[1]
            if job_id in state.running:
                changed.append(job_id)
        # The standing index is told only the nodes whose free GPUs changed: a cycle costs the same with more idle
        # nodes (the core reads the index, not the snapshot's node list).
        index = self._index
        if index is None:
            index = self._index = StandingIndex((), self.policy)
        for node_id in state.changed:
            index.update(self._view(state.by_id[node_id], state.free[node_id]))
        state.changed.clear()
        # Likewise the gangs: only those that started, stopped or were told to stop are looked at again.
        gangs = self._gangs
        for job_id in changed:
            before, gang = gangs.get(job_id), state.running.get(job_id)
            view = None if gang is None else self._gang(gang, now_us, state.work.restart_s)
            if view is before:
                continue
            self._unfile(before)
            if view is None:
                del gangs[job_id]
                continue
            gangs[job_id] = view  # a gang told to stop keeps its place; a new one goes last, as in the simulation
            for node_id in dict.fromkeys(node_id for node_id, _gpus in view.shards):
                self._gangs_on.setdefault(node_id, []).append(view)
        snapshot = Snapshot(nodes=(), running=tuple(gangs.values()), gangs_on=self._gangs_on, quotas=self.quotas)
        pending = [self._waiting(waiting) for waiting in state.pending.values()]
        audit = self.audit
        policy = self.estimating if audit is not None and audit.due(state.pending, now_us) else self.policy
        decisions = schedule(snapshot, pending, policy, now=at(now_us), index=index)
        if audit is not None and policy is self.estimating:
            decisions = self.calibration.corrected(decisions, at(now_us))
            audit.record(decisions, now_us, EPOCH)
        actions: list[Action] = []
        for decision in decisions:
            if isinstance(decision, Place):
                actions.append(Start(decision.job_id, _shards(decision), decision.degraded))
                self.calibration.started(decision.job_id, at(now_us))
            elif isinstance(decision, Preempt):
                actions.append(Stop(decision.job_id, decision.by_job))
        return actions

    def _unfile(self, view: RunningJob | None) -> None:
        if view is not None:
            for node_id in dict.fromkeys(node_id for node_id, _gpus in view.shards):
                on_node = self._gangs_on[node_id]
                on_node.remove(view)
                if not on_node:
                    del self._gangs_on[node_id]

    def _learn(self, state: State, changed: list[str]) -> None:
        """Jobs whose gang changed and that are neither running nor pending now have ended: learn their run times
        (what a real cluster observes once a job ended; never a job's duration before it ran)."""
        running, pending = state.running, state.pending
        ended = [
            self._jobs[job_id]
            for job_id in changed
            if job_id in self._jobs and job_id not in running and job_id not in pending
        ]
        for job in ended:
            self.estimates.observe(_key(job), job.duration_s, job.expected_duration_s)
            for cache in (self._jobs, self._specs, self._pending, self._running):
                cache.pop(job.job_id, None)

    def _expected_s(self, job: TraceJob) -> float | None:
        """The job's whole expected run time: declared, else estimated (None: unknown)."""
        if job.expected_duration_s is not None:
            return job.expected_duration_s
        return self.estimates.estimate(_key(job))

    def _spread(self, job: TraceJob) -> tuple[float, ...]:
        """The job's run time's spread, as learned; its true run time alone where the audit asks for the oracle."""
        if self.audit is not None and self.audit.oracle:
            return (job.duration_s,)
        return self.estimates.spread(_key(job), job.expected_duration_s)

    # The views below are cached: a cycle rebuilds only what changed since the last one.
    def _view(self, node: NodeSpec, free: tuple[int, ...]) -> NodeView:
        view = self._views.get(node.node_id)
        if view is None or view.free_gpus != free:
            used = node.gpus - len(free)
            view = self._views[node.node_id] = NodeView(
                node_id=node.node_id,
                status=NodeStatus.ALIVE,
                address=f"{node.node_id}.sim",
                gpu_model=node.gpu_model,
                tflops=node.tflops,
                free_gpus=free,
                free_memory_bytes=node.gpus * NODE_MEMORY_PER_GPU - used * SHARD_MEMORY,
                free_cpu_cores=node.gpus * NODE_CPU_PER_GPU - used * SHARD_CPU,
                cpu_load=0.0,
                rendezvous_ports=tuple(range(FIRST_PORT, FIRST_PORT + node.gpus)),
                total_gpus=node.gpus,
                total_memory_bytes=node.gpus * NODE_MEMORY_PER_GPU,
                total_cpu_cores=node.gpus * NODE_CPU_PER_GPU,
                artifacts=ARTIFACTS,
            )
        return view

    def _spec(self, waiting: Waiting) -> JobSpec:
        job = waiting.job
        spec = self._specs.get(job.job_id)
        if spec is None:
            spec = self._specs[job.job_id] = JobSpec(
                job_id=job.job_id,
                task_type="simulated",
                priority=job.priority,
                gpu_count=job.gpus,
                gpu_model=job.gpu_model,
                min_tflops=job.min_tflops,
                memory_bytes=job.gpus * SHARD_MEMORY,
                cpu_cores=job.gpus * SHARD_CPU,
                model_path=MODEL_PATH,
                dataset_path=DATASET_PATH,
                shard_count=job.gpus,
                sync_interval=100,
                max_steps=1,
                batch_size=1,
                seq_len=1,
                lr=1e-3,
                seed=0,
                submitted_at=at(to_us(job.submit_s)),
                min_match=job.min_match,
                max_wait_s=job.max_wait_s,
                queue=job.queue or DEFAULT_QUEUE,
                elasticity=None
                if job.min_shards is None
                else Elasticity(min_shards=job.min_shards, max_shards=job.max_shards or job.gpus),
            )
        return spec

    def _waiting(self, waiting: Waiting) -> PendingJob:
        known = self._pending.get(waiting.job.job_id)
        if known is None or known[0] != waiting.ready_us:
            job = waiting.job
            self._jobs[job.job_id] = job
            done_s = max(0.0, job.duration_s - waiting.remaining_s)
            expected = self._expected_s(job)
            known = self._pending[job.job_id] = (
                waiting.ready_us,
                PendingJob(
                    self._spec(waiting),
                    at(waiting.ready_us),
                    attained_gpu_s=job.gpus * done_s,
                    expected_run_s=None if expected is None else max(1.0, expected - done_s),
                    run_quantiles=self._spread(job),
                ),
            )
        return known[1]

    def _gang(self, gang: Gang, now_us: int, restart_s: float) -> RunningJob:
        """The gang as the core sees it at ``now_us``: its last periodic checkpoint, its restart cost."""
        job, times = gang.job, gang.times
        checkpointed = times.checkpointed_us(now_us)
        known = self._running.get(job.job_id)
        stamp = (gang.started_us, checkpointed, gang.version)
        if known is None or known[:3] != stamp or known[3].preempted_by != gang.preempted_by:
            if gang.preempted_by is None:
                heapq.heappush(self._due, (times.next_checkpoint_us(now_us), job.job_id))
            done_s = max(0.0, job.duration_s - gang.remaining_s)
            expected = self._expected_s(job)
            end = None
            if expected is not None:
                end = at(gang.resumed_us) + timedelta(seconds=max(1.0, expected - done_s) / gang.rate)
            known = self._running[job.job_id] = (
                *stamp,
                RunningJob(
                    job_id=job.job_id,
                    priority=job.priority,
                    preemptible=True,
                    started_at=at(gang.started_us),
                    shards=gang.shards,
                    memory_per_shard=SHARD_MEMORY,
                    cpu_per_shard=SHARD_CPU,
                    preempted_by=gang.preempted_by,
                    attained_gpu_s=job.gpus * done_s,
                    expected_end=end,
                    queue=job.queue or DEFAULT_QUEUE,
                    checkpointed_at=None if checkpointed is None else at(checkpointed),
                    restart_s=restart_s,
                    run_quantiles=self._spread(job),
                ),
            )
        return known[3]


def _key(job: TraceJob) -> EstimateKey:
    return EstimateKey(job.user or job.queue, job.gpu_model, job.gpus, job.queue)


def _shards(place: Place) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The core's one-GPU shards, grouped by node in placement order."""
    by_node: dict[str, list[int]] = {}
    for shard in place.placements:
        by_node.setdefault(shard.node_id, []).extend(shard.gpu_indices)
    return tuple((node_id, tuple(gpus)) for node_id, gpus in by_node.items())


BASELINES: Mapping[str, PolicyFn] = MappingProxyType(
    {"fifo": fifo, "priority": priority_first, "first-fit": first_fit, "sjf-oracle": sjf_oracle}
)


def policy_named(
    name: str,
    nodes: Sequence[NodeSpec],
    policy: Policy | None = None,
    quotas: QueuesConfig | None = None,
    audit: StartAudit | None = None,
) -> PolicyFn:
    """A fresh policy (the core's caches are per run); ``policy`` sets the core's knobs, ``quotas`` its queues (the
    baselines know no queues); ``audit`` records the ``shardyard`` policy's start estimates."""
    if name == "shardyard":
        return CorePolicy(nodes, policy, quotas=quotas, audit=audit)
    if name == ORDER_VICTIMS:
        return CorePolicy(nodes, replace(policy or Policy(), victims="order"), quotas=quotas)
    if name == ONE_QUEUE:
        return CorePolicy(nodes, policy)
    baseline = BASELINES.get(name)
    if baseline is None:
        raise ValueError(f"unknown policy {name!r}; the policies are {', '.join(POLICY_NAMES)}")
    return baseline


def policy_with(options: Sequence[str], base: Policy | None = None) -> Policy:
    """``base`` (the default Policy) with ``KEY=VALUE`` options set: numbers, ``true``/``false``, a comma-separated
    list for a tuple, one of the allowed words for ``order``. Raises ConfigError naming the option."""
    policy = base or Policy()
    known = {f.name: f for f in fields(Policy)}
    changes: dict[str, object] = {}
    for option in options:
        key, sep, raw = option.partition("=")
        key, raw = key.strip().replace("-", "_"), raw.strip()
        if not sep or key not in known:
            raise ConfigError(f"--policy-option {option!r}: write KEY=VALUE with KEY one of {', '.join(sorted(known))}")
        changes[key] = _option_value(key, raw, getattr(policy, key))
    try:
        return replace(policy, **changes)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"--policy-option: {exc}") from exc


def _option_value(key: str, raw: str, current: object) -> object:
    problem = f"--policy-option {key}={raw!r}"
    try:
        if isinstance(current, bool):
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError("expected true or false")
            return raw.lower() in ("true", "1", "yes")
        if isinstance(current, int):
            return int(raw)
        if isinstance(current, float):
            value = float(raw)
            if not math.isfinite(value) or value < 0:
                raise ValueError("expected a finite number >= 0")
            return value
        if isinstance(current, tuple):
            values = tuple(sorted(float(part) for part in raw.split(",") if part.strip()))
            if any(not math.isfinite(v) or v <= 0 for v in values):
                raise ValueError("expected positive numbers, comma-separated")
            return values
        words = WORDS.get(key)
        if words is not None:
            if raw not in words:
                raise ValueError(f"expected one of {', '.join(words)}")
            return raw
    except ValueError as exc:
        raise ConfigError(f"{problem}: {exc}") from None
    raise ConfigError(f"{problem}: this setting cannot be set from the command line")


WORDS: Mapping[str, tuple[str, ...]] = MappingProxyType({"order": ("las", "aging"), "victims": ("lost-work", "order")})
"""The settings that take one of a few words, and those words."""
