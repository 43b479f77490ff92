"""What the placement policy reads and returns: a frozen cluster snapshot, the pending jobs, the policy knobs, and
decisions as data (place, preempt, unschedulable-with-reason). No I/O, no clock."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from shardyard.events import JobSpec, NodeStatus, PendingReason, ShardPlacement


@dataclass(frozen=True)
class Policy:
    """The knobs of the placement policy; the defaults are Shardyard's."""

    load_threshold: float = 0.5
    """Nodes at or above this CPU load take no new shards (S16: load < 50 %)."""
    load_step: float = 0.1
    """"Least load" compares loads in steps of this size, so locality, fragmentation and latency decide among
    nodes of about the same load instead of load differences of a few tenths of a percent."""
    aging_per_minute: float = 1.0
    """A pending job's effective priority grows by this much per minute waited, so nothing starves."""
    reservations: int = 1
    """How many blocked jobs, in queue order, hold a reservation that lower jobs may not backfill into."""
    preemption: bool = True
    """Checkpoint and requeue lower-priority preemptible jobs when a higher-priority one cannot otherwise fit."""
    latency_window: int = 8
    """Equally ranked nodes examined beyond those a gang needs, to pick the ones with the lowest mutual RTT."""


@dataclass(frozen=True)
class NodeView:
    """One node as the policy sees it in a cycle: its free resources after every admitted gang."""

    node_id: str
    status: NodeStatus
    address: str
    gpu_model: str
    tflops: float
    free_gpus: tuple[int, ...]
    free_memory_bytes: int
    free_cpu_cores: float
    cpu_load: float
    rendezvous_ports: tuple[int, ...] = ()
    """Free ports of the node's rendezvous range (a gang's coordinator listens on one)."""
    total_gpus: int = -1
    """All GPUs of the node, free or not (-1: as many as are free)."""
    total_memory_bytes: int = -1
    total_cpu_cores: float = -1.0
    draining: bool = False
    artifacts: Mapping[str, str] = field(default_factory=dict)
    """Job paths present on the node: path -> "local" (its own disk) or "shared" (a network path)."""
    zone: str = ""
    rack: str = ""

    @property
    def gpu_total(self) -> int:
        return self.total_gpus if self.total_gpus >= 0 else len(self.free_gpus)


@dataclass(frozen=True)
class RunningJob:
    """A gang holding GPUs; preemption may free them."""

    job_id: str
    priority: int
    preemptible: bool
    started_at: datetime
    shards: tuple[tuple[str, tuple[int, ...]], ...]
    """(node id, GPU indices) of each shard."""
    memory_per_shard: int = 0
    cpu_per_shard: float = 0.0
    preempted_by: str | None = None
    """Set while the gang is checkpointing to make room for that job."""


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    running: tuple[RunningJob, ...] = ()
    rtt_ms: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """Measured round-trip times between nodes (either order); topology labels estimate the rest."""


@dataclass(frozen=True)
class PendingJob:
    spec: JobSpec
    ready_at: datetime
    """When the job last became ready (submission, release by its parents, or requeue): aging and max_wait count
    from here."""
    excluded_nodes: frozenset[str] = frozenset()
    not_before: datetime | None = None
    """A recovering job waits out its retry backoff until then."""
    spares: int = 0
    """Warm spares wanted with the gang; placed when capacity allows, never a reason to wait."""


@dataclass(frozen=True)
class Place:
    job_id: str
    placements: tuple[ShardPlacement, ...]
    """The gang's shards (indices 0..k-1), then its spares (``spare=True``, indices k..)."""
    coordinator_node: str
    degraded: bool = False


@dataclass(frozen=True)
class Preempt:
    """Checkpoint and requeue ``job_id`` so that ``by_job`` can fit."""

    job_id: str
    by_job: str


@dataclass(frozen=True)
class Unschedulable:
    job_id: str
    reason: PendingReason
    message: str
    node_counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Invalid:
    """The job could not be decided for at all: deciding raised on its data (``message`` says how). The job fails
    with ``INVALID_SPEC``; every other job of the cycle is decided as usual."""

    job_id: str
    message: str


Decision = Place | Preempt | Unschedulable | Invalid
