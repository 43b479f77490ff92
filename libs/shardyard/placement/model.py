"""What the placement policy reads and returns: a frozen cluster snapshot, the pending jobs, the policy knobs, and
decisions as data (place, preempt, unschedulable-with-reason). No I/O, no clock."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from shardyard.events import JobSpec, MissingArtifact, NodeStatus, PendingReason, ShardPlacement
from shardyard.events.job import CoordinatorSource
from shardyard.quotas import DEFAULT_QUEUE, QueuesConfig
from shardyard.units import format_bytes


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
    reserve_after_s: float = 0.0
    """A blocked job holds a reservation only once it has been ready this long (Slurm's ``bf_min_age_reserve``):
    nodes are not held idle for a job that preemption or the next ending gang will let in soon anyway."""
    preemption: bool = True
    """Checkpoint and requeue lower-priority preemptible jobs when a higher-priority one cannot otherwise fit."""
    latency_window: int = 8
    """Equally ranked nodes examined beyond those a gang needs, to pick the ones with the lowest mutual RTT."""
    order: Literal["las", "aging"] = "las"
    """Queue order of the pending jobs (``candidate.queue_key``). ``las``: priority, then least attained service
    (GPU-seconds run so far, in the discrete queues of ``las_thresholds_gpu_s``: Tiresias's 2D-LAS, no durations
    needed), then the longest ready; a job that waited ``starve_factor`` times its own run time is back in the
    first queue. ``aging``: priority plus ``aging_per_minute`` per minute waited, then the longest ready."""
    las_thresholds_gpu_s: tuple[float, ...] = (3600.0, 36_000.0, 360_000.0)
    """GPU-seconds of service that move a job to the next LAS queue: 1 GPU-hour, then 10, then 100 (so a job that
    has run for days yields to one that has run for hours)."""
    starve_factor: float = 2.0
    """``las``: a job in a later queue that has waited this many times as long as it ran is back in the first."""
    min_runtime_s: float = 600.0
    """``las``: a gang runs this long in an attempt before a job of its priority from an earlier queue may preempt
    it; preemption for a higher priority does not wait (this bounds the churn LAS causes, not priority)."""
    backfill: bool = True
    """Time-aware backfill: a job expected to end before a reservation starts (``PendingJob.expected_run_s``, the
    reserved nodes' gangs' ``RunningJob.expected_end``) may use the reserved nodes meanwhile."""
    # The start estimates' knobs change no decision: policies that differ only in them compare equal (a standing
    # index built for one serves the other; the simulator estimates only in the cycles its audit asks for).
    start_estimates: int = field(default=100, compare=False)
    """How many jobs waiting on capacity, in queue order, get estimated starts (``intervals``); 0: only a job
    holding a reservation, its reservation's start."""
    start_samples: int = field(default=32, compare=False)
    """Draws of the gangs' run times the start estimates are taken over (``placement.intervals``)."""
    victims: Literal["lost-work", "order"] = "lost-work"
    """Which gangs a job preempts among those it outranks. ``lost-work``: the set that loses least
    (``RunningJob.lost_gpu_s``: GPUs x the time since the gang's last checkpoint, plus its restart cost), ties to the
    lower priority, then the newest gang. ``order``: the first gangs of the victim order that make room (the rule
    before lost work was counted; kept for comparison in the simulator)."""
    restart_s: float = 60.0
    """Seconds a preempted gang is expected to lose to its restart, on each GPU (launch, loading its checkpoint),
    for gangs the scheduler has no measure of."""
    disk_floor_bytes: int = 1 << 30
    """A node whose output disk (where checkpoints go) has less free space than this takes no new shards: a job
    placed there would fail DISK_FULL at its first checkpoint. 1 GiB."""

    @property
    def disk_floor(self) -> str:
        """The floor as people read it (``1GiB``): the disk filter's label names it."""
        return format_bytes(self.disk_floor_bytes)


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
    absent_artifacts: frozenset[str] | None = None
    """Job paths its agent looked for and did not find (or could not look at); a path in neither this nor
    ``artifacts`` has not been looked at yet. None: the view does not say (every path not present counts as looked
    for and absent)."""
    mounts: Mapping[str, str] = field(default_factory=dict)
    """Job path prefix -> the node's local directory, as its agent mounts them (where a missing artifact goes)."""
    zone: str = ""
    rack: str = ""
    disk_free_bytes: int | None = None
    """Free space of the node's output disk (None: not reported; the disk filter passes it)."""

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
    attained_gpu_s: float = 0.0
    """GPU-seconds the job ran in its earlier attempts (this one's run time adds to it)."""
    expected_end: datetime | None = None
    """When the gang is expected to end (declared or estimated duration); None: unknown. Once a gang is past it, it
    is expected to run on as long again as it has run in this attempt (``worth.overrun_end``)."""
    queue: str = DEFAULT_QUEUE
    """The queue its job was submitted to (quotas and reclaim count it there)."""
    checkpointed_at: datetime | None = None
    """When this attempt last wrote a durable checkpoint (None: none yet; its work since ``started_at`` is at stake)."""
    restart_s: float | None = None
    """Seconds its restart is expected to cost on each GPU (None: ``Policy.restart_s``)."""
    live: bool = False
    """Whether stopping it loses no work: an elastic gang's surplus shard (``placement.surplus``), given up by
    re-forming the gang from its live state. Its loss is its restart alone."""
    run_quantiles: tuple[float, ...] = ()
    """Its job's whole run time at each quantile level of ``placement.estimates`` (its earlier attempts' run
    included); empty: ``expected_end`` alone. Start estimates draw its end from it (``placement.intervals``)."""
    gpu_count: int = field(init=False, repr=False, compare=False)
    """Its GPUs, all shards together (worked out once: every cycle reads it)."""
    started_us: int = field(init=False, repr=False, compare=False)
    """``started_at`` in whole microseconds since the epoch (likewise; exact, as datetime arithmetic is)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_count", sum(len(gpus) for _node, gpus in self.shards))
        object.__setattr__(self, "started_us", epoch_us(self.started_at))

    def lost_gpu_s(self, now: datetime, default_restart_s: float) -> float:
        """GPU-seconds lost were the gang stopped at ``now``: every GPU's time since the last durable checkpoint
        (since the start without one), plus the restart cost."""
        restart = self.restart_s if self.restart_s is not None else default_restart_s
        if self.live:
            return self.gpu_count * restart
        since = self.checkpointed_at if self.checkpointed_at is not None else self.started_at
        return self.gpu_count * (max(0.0, (now - since).total_seconds()) + restart)


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_us(when: datetime) -> int:
    """``when`` in whole microseconds since the epoch."""
    return (when - EPOCH) // timedelta(microseconds=1)


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    running: tuple[RunningJob, ...] = ()
    rtt_ms: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """Measured round-trip times between nodes (either order); topology labels estimate the rest."""
    mean_rtt_ms: Mapping[str, float] = field(default_factory=dict)
    """Each node's mean measured RTT to all the peers it was measured with: breaks a tie between coordinators."""
    slow_nodes: frozenset[str] = frozenset()
    """Nodes whose measured links are mostly out of line with the cluster's (``shardyard.links``): a gang spread
    over several nodes is placed off them when it fits elsewhere."""
    degraded: frozenset[str] = frozenset()
    """Nodes a straggler was swapped off lately (``JobStraggling``): every gang is placed off them when it fits
    elsewhere; they rank last."""
    gangs_on: Mapping[str, Sequence[RunningJob]] | None = None
    """Node id -> the ``running`` gangs holding GPUs there, when the caller keeps this map up to date across cycles
    (the simulator does); None: the cycle builds it from ``running`` when a reservation needs it."""
    quotas: QueuesConfig | None = None
    """The cluster's queues (``shardyard.quotas``): quotas, borrowing, fair share and reclaim. None: one queue
    without quotas, placement as it always was."""


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
    attained_gpu_s: float = 0.0
    """GPU-seconds the job ran in earlier attempts (its LAS queue)."""
    expected_run_s: float | None = None
    """How long the job is expected to run once started (what is left of its declared or estimated duration);
    None: unknown. Only a job with an expectation backfills onto reserved nodes."""
    run_quantiles: tuple[float, ...] = ()
    """Its whole run time at each quantile level of ``placement.estimates`` (what its earlier attempts ran
    included); empty: ``expected_run_s`` alone. Start estimates draw from it (``placement.intervals``)."""


@dataclass(frozen=True)
class Place:
    job_id: str
    placements: tuple[ShardPlacement, ...]
    """The gang's shards (indices 0..k-1), then its spares (``spare=True``, indices k..)."""
    coordinator_node: str
    degraded: bool = False
    coordinator_source: CoordinatorSource = "single-node"


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
    estimated_start: datetime | None = None
    """When the job is expected to start, the median (p50) over draws of the gangs' run times
    (``shardyard.placement.intervals``); a reservation's start, where no estimates were made this cycle."""
    estimated_start_p90: datetime | None = None
    """The start by which 90 % of the draws have the job started; None: not known."""
    missing: tuple[MissingArtifact, ...] = ()
    """WAITING_FOR_ARTIFACT: the job's paths that nodes it could use lack, and which (``contention.missing``)."""


@dataclass(frozen=True)
class Invalid:
    """The job could not be decided for at all: deciding raised on its data (``message`` says how). The job fails
    with ``INVALID_SPEC``; every other job of the cycle is decided as usual."""

    job_id: str
    message: str


Decision = Place | Preempt | Unschedulable | Invalid
