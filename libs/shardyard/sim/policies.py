"""The policies the simulator compares, by name.

``shardyard`` is not a model of Shardyard: ``CorePolicy`` builds the same frozen ``Snapshot`` the scheduler service
builds and calls the same pure function, ``shardyard.placement.cycle.schedule``; it only translates the
decisions (Place -> ``Start``, Preempt -> ``Stop``, Unschedulable -> nothing). ``fifo`` and ``priority`` are the
plain baselines of ``shardyard.sim.baselines``.

Every simulated node holds the jobs' model and dataset on a shared path, has ample memory and CPU for its GPUs and
no CPU load, so GPUs are the binding resource.
"""

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from shardyard.events import JobSpec, NodeStatus
from shardyard.placement.cycle import schedule
from shardyard.placement.model import NodeView, PendingJob, Place, Policy, Preempt, RunningJob, Snapshot
from shardyard.sim.baselines import fifo, priority_first
from shardyard.sim.cluster import NodeSpec
from shardyard.sim.engine import Action, Gang, PolicyFn, Start, State, Stop, Waiting, to_us

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

    def __init__(self, nodes: Sequence[NodeSpec], policy: Policy | None = None) -> None:
        self.nodes = tuple(nodes)
        self.policy = policy or Policy()
        self._views: dict[str, NodeView] = {}
        self._specs: dict[str, JobSpec] = {}
        self._pending: dict[str, tuple[int, PendingJob]] = {}
        """Job id -> (ready time, the job as the core sees it)."""
        self._running: dict[str, tuple[int, RunningJob]] = {}
        """Job id -> (start time, the gang as the core sees it)."""

    def __call__(self, state: State, now_us: int) -> list[Action]:
        snapshot = Snapshot(
            nodes=tuple(self._view(node, state.free[node.node_id]) for node in self.nodes),
            running=tuple(self._gang(gang) for gang in state.running.values()),
        )
        pending = [self._waiting(waiting) for waiting in state.pending.values()]
        actions: list[Action] = []
        for decision in schedule(snapshot, pending, self.policy, now=at(now_us)):
            if isinstance(decision, Place):
                actions.append(Start(decision.job_id, _shards(decision), decision.degraded))
            elif isinstance(decision, Preempt):
                actions.append(Stop(decision.job_id, decision.by_job))
        return actions

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
            )
        return spec

    def _waiting(self, waiting: Waiting) -> PendingJob:
        known = self._pending.get(waiting.job.job_id)
        if known is None or known[0] != waiting.ready_us:
            known = self._pending[waiting.job.job_id] = (
                waiting.ready_us,
                PendingJob(self._spec(waiting), at(waiting.ready_us)),
            )
        return known[1]

    def _gang(self, gang: Gang) -> RunningJob:
        known = self._running.get(gang.job.job_id)
        if known is None or known[0] != gang.started_us or known[1].preempted_by != gang.preempted_by:
            known = self._running[gang.job.job_id] = (
                gang.started_us,
                RunningJob(
                    job_id=gang.job.job_id,
                    priority=gang.job.priority,
                    preemptible=True,
                    started_at=at(gang.started_us),
                    shards=gang.shards,
                    memory_per_shard=SHARD_MEMORY,
                    cpu_per_shard=SHARD_CPU,
                    preempted_by=gang.preempted_by,
                ),
            )
        return known[1]


def _shards(place: Place) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The core's one-GPU shards, grouped by node in placement order."""
    by_node: dict[str, list[int]] = {}
    for shard in place.placements:
        by_node.setdefault(shard.node_id, []).extend(shard.gpu_indices)
    return tuple((node_id, tuple(gpus)) for node_id, gpus in by_node.items())


POLICY_NAMES = ("shardyard", "fifo", "priority")


def policy_named(name: str, nodes: Sequence[NodeSpec]) -> PolicyFn:
    """A fresh policy (the core's caches are per run)."""
    if name == "shardyard":
        return CorePolicy(nodes)
    if name == "fifo":
        return fifo
    if name == "priority":
        return priority_first
    raise ValueError(f"unknown policy {name!r}; the policies are {', '.join(POLICY_NAMES)}")
