"""Job lifecycle events, published on the lifecycle topic keyed by job id, and the normalised job spec."""

import re
from enum import StrEnum
from typing import Annotated, Final, Literal, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from shardyard.events.base import AwareDatetime, Event, Model
from shardyard.events.node import MissingArtifact
from shardyard.events.reasons import FailureCause, PendingReason, RejectReason
from shardyard.events.straggler import JobStraggling

RESERVED_ENV: Final = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"})
"""Variables of the torchrun environment the runtime sets for a user's command; a job's ``env`` cannot set them."""
RESERVED_ENV_PREFIXES: Final = ("MASTER_", "SHARDYARD_")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _env_name(name: str) -> str:
    if not _ENV_NAME.match(name):
        raise ValueError(f"{name!r} is not an environment variable name (letters, digits, '_'; not a digit first)")
    if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
        raise ValueError(
            f"{name} is set by the runtime (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_*, SHARDYARD_*)"
        )
    return name


_NoNul = Field(pattern=r"^[^\x00]*$")  # exec refuses NUL bytes in arguments, variables and paths
Argument = Annotated[str, Field(min_length=1, max_length=65_536), _NoNul]
EnvName = Annotated[
    str,
    Field(min_length=1, max_length=256),
    AfterValidator(_env_name),
    WithJsonSchema({"type": "string", "pattern": _ENV_NAME.pattern, "maxLength": 256}),
]
EnvValue = Annotated[str, Field(max_length=65_536), _NoNul]


class Entrypoint(Model):
    """A user's own training command, run once per shard instead of the built-in runner (see
    :mod:`shardyard.training.entry` for the environment it gets and what its exit status means).

    ``command`` is an argv list, executed directly (never through a shell); its first element is looked up on the
    agent's ``PATH``. ``env`` is added to the agent's environment; the torchrun variables and ``SHARDYARD_*`` are the
    runtime's. ``working_dir`` is a job path (mapped through the agent's mounts); relative paths and the default are
    the agent's working directory.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    command: list[Argument] = Field(min_length=1, max_length=4096, description="argv, run without a shell")
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, max_length=1024, description="extra environment variables (not RANK, MASTER_*, ...)"
    )
    working_dir: Annotated[str, Field(min_length=1, max_length=4096), _NoNul] | None = Field(
        default=None, description="directory the command runs in (a job path); default: the agent's"
    )


MAX_SEED: Final = 2**32 - 1
"""The widest seed every generator takes (NumPy's)."""


# One value from the submission to the shard: the job spec and the workload hold these fields flat on the wire (their
# schemas name them one by one) and give them back as this value (``.training``); the agent turns it into the
# runner's environment (``shardyard.training.config.training_env``). Nobody copies them field by field.
class TrainingParams(BaseModel):
    """Knobs of the built-in fine-tune runner; every one has a default."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    max_steps: int = Field(default=300, ge=1, le=10_000_000)
    batch_size: int = Field(default=8, ge=1, le=65_536)
    seq_len: int = Field(default=64, ge=2, le=1_000_000)
    lr: float = Field(default=3e-3, gt=0, le=10)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)


TRAINING_FIELDS: Final = tuple(TrainingParams.model_fields)


def training_of(holder: object) -> TrainingParams:
    """The training parameters a spec or a workload holds flat. Not validated again: they were at admission, and a
    spec built in code (the simulator's) may carry placeholders."""
    return TrainingParams.model_construct(**{name: getattr(holder, name) for name in TRAINING_FIELDS})


class Elasticity(Model):
    """An elastic job's sizes (``SubmittedElasticity``): ``min_shards`` <= its spec's preferred ``shard_count`` <=
    ``max_shards``."""

    min_shards: int = Field(ge=1)
    max_shards: int = Field(ge=1)


class JobSpec(Model):
    """A validated submission, normalised: what every service after the queue works from."""

    job_id: str
    task_type: str
    priority: int
    gpu_count: int
    gpu_model: str | None
    min_tflops: float
    memory_bytes: int
    cpu_cores: float
    model_path: str
    dataset_path: str
    shard_count: int
    sync_interval: int
    max_steps: int
    batch_size: int
    seq_len: int
    lr: float
    seed: int
    submitted_at: AwareDatetime
    depends_on: tuple[str, ...] = ()
    on_dependency_failure: Literal["fail", "hold"] = "fail"
    min_match: float | None = Field(default=None, description="degraded placement floor; None: full match only")
    max_wait_s: float = 0.0
    preemptible: bool = True
    entrypoint: Entrypoint | None = Field(default=None, description="the user's own command; None: built-in runner")
    expected_duration_s: float | None = Field(default=None, description="declared run time (s); None: estimated")
    owner: str | None = Field(default=None, description="who submitted it; None: the submission named nobody")
    queue: str = Field(default="default", description="the queue it was submitted to")
    elasticity: Elasticity | None = Field(default=None, description="its range of sizes; None: rigid")

    @property
    def training(self) -> TrainingParams:
        return training_of(self)

    @property
    def memory_per_shard(self) -> int:
        return -(-self.memory_bytes // self.shard_count)

    @property
    def cpu_per_shard(self) -> float:
        return self.cpu_cores / self.shard_count


class FieldError(Model):
    field: str
    problem: str
    input: str | None = None

    """The disk failed a read or write (``EIO``, or ``EROFS``: a filesystem remounted read-only after errors): the
    message names the path. The node is kept out of the job's retries, as for a GPU fault."""


class ShardPlacement(Model):
    shard_index: int
    node_id: str
    gpu_indices: tuple[int, ...]
    gpu_model: str
    match_score: float
    degraded: bool = False
    spare: bool = Field(default=False, description="a warm spare held for the gang; it trains only once promoted")


class Signature(Protocol):
    """A verified signature (``shardyard.signing.Signed``)."""

    @property
    def team(self) -> str: ...
    @property
    def key_id(self) -> str: ...
    @property
    def nonce(self) -> str: ...
    @property
    def expires_s(self) -> float: ...


class UsedSignature(Model):
    """The nonce of the good signature a verdict consumed, and until when it would verify: every queue replica that
    reads the verdict refuses the same signature again as ``REPLAYED`` (``shardyard.signing.ReplayCache``), not only
    the one that gave it."""

    nonce: str = Field(min_length=1, max_length=256)
    expires_s: float
    team: str | None = Field(default=None, max_length=256, description="the team whose key signed")
    key_id: str | None = Field(default=None, max_length=256, description="the key that signed (history shows it)")

    @classmethod
    def of(cls, signed: "Signature") -> "UsedSignature":
        """What a verdict records of a good signature."""
        return cls(nonce=signed.nonce, expires_s=signed.expires_s, team=signed.team, key_id=signed.key_id)


class JobAccepted(Event):
    type: Literal["job.accepted"] = "job.accepted"
    job_id: str
    spec: JobSpec
    source_offset: str = Field(description="topic/partition/offset of the submission, for idempotent admission")
    signature: UsedSignature | None = None
    """The signature the submission came with; None: unsigned."""


class JobRejected(Event):
    type: Literal["job.rejected"] = "job.rejected"
    job_id: str
    reason: RejectReason
    message: str
    errors: tuple[FieldError, ...] = ()
    source_offset: str
    signature: UsedSignature | None = None
    """A good signature the refused submission came with (its nonce is spent all the same); None: none."""


class JobReady(Event):
    type: Literal["job.ready"] = "job.ready"
    job_id: str
    spec: JobSpec


class JobUnschedulable(Event):
    type: Literal["job.unschedulable"] = "job.unschedulable"
    job_id: str
    reason: PendingReason
    message: str
    node_counts: dict[str, int] = Field(default_factory=dict, description="nodes excluded, by filter")
    estimated_start: AwareDatetime | None = Field(
        default=None,
        description="the median (p50) start expected, from its reservation or the plan; None: not known",
    )
    estimated_start_p90: AwareDatetime | None = Field(
        default=None, description="the p90 start: 90 % of the plan's samples have it started by then; None: not known"
    )
    missing_artifacts: tuple[MissingArtifact, ...] = Field(default=(), description="what WAITING_FOR_ARTIFACT waits on")


class JobWaiting(Event):
    """Held by the queue until its parent jobs succeed (or, with ``on_dependency_failure: hold``, after one failed)."""

    type: Literal["job.waiting"] = "job.waiting"
    job_id: str
    reason: PendingReason
    message: str
    waiting_for: tuple[str, ...] = ()


CoordinatorSource = Literal["measured", "mixed", "topology", "single-node"]
"""What the coordinator was chosen on: measured RTTs between all the gang's nodes, some measured and the rest
estimated from topology labels, labels only, or nothing (the whole gang on one node)."""


class JobScheduled(Event):
    type: Literal["job.scheduled"] = "job.scheduled"
    job_id: str
    attempt: int
    term: int
    coordinator_node: str
    rendezvous_port: int
    placements: tuple[ShardPlacement, ...]
    degraded: bool = Field(default=False, description="placed below a full match, as the job allowed")
    resume_from: str | None = Field(default=None, description="checkpoint the gang resumes from (after preemption)")
    coordinator_source: CoordinatorSource | None = Field(
        default=None, description="what the coordinator was chosen on: measured RTTs, topology labels (None: unsaid)"
    )


class ShardCause(Model):
    shard_index: int
    node_id: str
    cause: FailureCause
    message: str


class JobRecovering(Event):
    """The fault manager's recovery plan for a failed gang: re-form it (new attempt, new rendezvous) from the last
    checkpoint, on other nodes than ``exclude_nodes`` (and, for its next attempt only, ``avoid_nodes``), not before
    ``retry_at``. A plan that moves the job off a full disk to a node with room does not use the retry budget
    (``counted`` False)."""

    type: Literal["job.recovering"] = "job.recovering"
    job_id: str
    attempt: int = Field(description="the attempt that failed")
    cause: FailureCause
    message: str
    causes: tuple[ShardCause, ...] = ()
    exclude_nodes: tuple[str, ...] = ()
    avoid_nodes: tuple[str, ...] = Field(
        default=(), description="kept off for the next attempt only: a disk that filled may be cleaned up"
    )
    retry_at: AwareDatetime
    retries_used: int = Field(ge=0, description="of the retry budget, this plan included when it counts")
    retries_left: int = Field(ge=0)
    counted: bool = Field(default=True, description="False: a move off a full disk, not charged to the retry budget")


class JobPreempting(Event):
    """A higher-priority job needs this job's GPUs: its shards were asked to checkpoint and stop."""

    type: Literal["job.preempting"] = "job.preempting"
    job_id: str
    attempt: int
    by_job: str
    deadline_s: float


class JobPreempted(Event):
    """The gang stopped (checkpointed, or revoked after the deadline); the job is pending again."""

    type: Literal["job.preempted"] = "job.preempted"
    job_id: str
    attempt: int
    by_job: str
    checkpoint_dir: str | None
    checkpoint_step: int | None


class ResizeReason(StrEnum):
    """Why the scheduler re-formed an elastic job's gang at another size (``JobResized``)."""

    GROW_INTO_IDLE = "GROW_INTO_IDLE"
    """GPUs no waiting job can use were free: the gang grew towards its ``max_shards``."""
    SHRINK_FOR_PREEMPTION = "SHRINK_FOR_PREEMPTION"
    """A job that may preempt this one needed GPUs: the gang gave up shards above its ``min_shards`` instead of
    being stopped whole."""
    SHRINK_FOR_RECLAIM = "SHRINK_FOR_RECLAIM"
    """A queue reclaimed quota this job's queue had borrowed: likewise, its shards above ``min_shards`` went."""


class JobResized(Event):
    """The scheduler re-forms a running elastic gang at another size: the attempt ``attempt`` stops and the next one
    starts at once on its kept shards (and new ones when it grows), resuming from the members' live state. Not a
    fault: no retry is used. ``by_job``: the job a shrink made room for."""

    type: Literal["job.resized"] = "job.resized"
    job_id: str
    attempt: int = Field(description="the attempt the resize ends")
    from_shards: int = Field(ge=1)
    to_shards: int = Field(ge=1)
    reason: ResizeReason
    by_job: str | None = None
    message: str = ""


class JobRunning(Event):
    type: Literal["job.running"] = "job.running"
    job_id: str
    attempt: int


class JobSucceeded(Event):
    type: Literal["job.succeeded"] = "job.succeeded"
    job_id: str
    attempt: int
    final_loss: float | None
    checkpoint_dir: str | None


class JobFailed(Event):
    type: Literal["job.failed"] = "job.failed"
    job_id: str
    attempt: int
    cause: FailureCause
    message: str
    causes: tuple[ShardCause, ...] = ()


class JobCancelRequested(Event):
    """A user asks to cancel a job (``shardyard cancel JOB``); the service that holds the job carries it out."""

    type: Literal["job.cancel_requested"] = "job.cancel_requested"
    job_id: str
    requested_by: str = "cli"
    signature: UsedSignature | None = None
    """A team's signed cancel (``shardyard.queue.team_cancel``): the signature it spent; None: not signed."""


class JobCancelled(Event):
    type: Literal["job.cancelled"] = "job.cancelled"
    job_id: str
    message: str


LifecycleFact = (
    JobAccepted
    | JobRejected
    | JobReady
    | JobWaiting
    | JobUnschedulable
    | JobScheduled
    | JobRunning
    | JobSucceeded
    | JobFailed
    | JobRecovering
    | JobPreempting
    | JobPreempted
    | JobResized
    | JobStraggling
    | JobCancelRequested
    | JobCancelled
)
"""Every event of a job's lifecycle: the one list of them. A new lifecycle event is declared here only: the lifecycle
topic carries this union (:data:`JobLifecycleEvent`), and the codec routes each of its members to that topic."""

JobLifecycleEvent = Annotated[LifecycleFact, Field(discriminator="type")]
