"""Assignments (scheduler -> agent, keyed by node) and shard events (agent -> everyone, keyed by job)."""

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from shardyard.events.base import Event, Model
from shardyard.events.job import Entrypoint, FailureCause, TrainingParams, training_of


class Workload(Model):
    """What a shard runs: the built-in fine-tune runner and its inputs (paths as the job wrote them), or the job's own
    ``entrypoint`` command with the same inputs in its environment."""

    model_path: str
    dataset_path: str
    output_path: str
    sync_interval: int
    max_steps: int
    batch_size: int
    seq_len: int
    lr: float
    seed: int
    resume_from: str | None = Field(default=None, description="checkpoint directory to resume from (job path)")
    entrypoint: Entrypoint | None = Field(default=None, description="the job's own command; None: the built-in runner")
    global_batch: int | None = Field(
        default=None,
        ge=1,
        description="samples per step for the whole gang, kept at every world size (an elastic job's: its preferred"
        " shard count x batch_size); None: world_size x batch_size",
    )

    @property
    def training(self) -> TrainingParams:
        return training_of(self)


class ShardAssignment(Event):
    type: Literal["shard.assignment"] = "shard.assignment"
    job_id: str
    shard_index: int = Field(ge=0)
    world_size: int = Field(ge=1)
    node_id: str
    gpu_indices: tuple[int, ...]
    attempt: int = Field(ge=1)
    term: int = Field(ge=1, description="the scheduler leader's term; agents refuse older terms")
    master_addr: str
    master_port: int = Field(gt=0, lt=65536)
    workload: Workload
    spare: bool = Field(default=False, description="hold the GPU for the gang; start nothing until promoted")
    notice_s: float | None = Field(
        default=None,
        gt=0,
        description="how long a preemption notice gives the shard to checkpoint and stop before it is revoked (the "
        "scheduler's preempt_deadline_s); None: the agent's default, 30 s",
    )


class RevocationReason(StrEnum):
    """Why the scheduler stops a shard at once (its agent kills it; the resource pool frees its GPUs)."""

    STALE_PLACEMENT = "STALE_PLACEMENT"
    """A deposed leader's placement, or one superseded by a newer leader's: the job runs under the newest one."""
    START_TIMEOUT = "START_TIMEOUT"
    """Not reported started within the start deadline of its assignment (reported failed ``START_TIMEOUT`` too)."""
    ORPHANED = "ORPHANED"
    """Past its start deadline its node stopped reporting it running (reported failed ``ORPHANED`` too)."""
    PREEMPTION_TIMEOUT = "PREEMPTION_TIMEOUT"
    """Asked to checkpoint and stop for a higher-priority job, it had not stopped by the preemption deadline."""
    RECOVERING = "RECOVERING"
    """Its attempt failed: what is left of the gang stops before the gang re-forms."""
    RESIZING = "RESIZING"
    """Its elastic gang re-forms at another size (``JobResized``): every shard stops, keeping its live state, and the
    next attempt resumes from it."""
    CANCELLED = "CANCELLED"
    """Its job was cancelled."""
    JOB_FAILED = "JOB_FAILED"
    """Its job ended FAILED: its GPUs are freed at once."""
    JOB_SUCCEEDED = "JOB_SUCCEEDED"
    """Its job ended SUCCEEDED: the spares it held are released."""


class StopReason(StrEnum):
    """Why the scheduler asks a shard to checkpoint and stop."""

    PREEMPTED = "PREEMPTED"
    """A higher-priority job needs its GPUs; the job is requeued and resumes from the checkpoint."""


class ShardRevocation(Event):
    type: Literal["shard.revocation"] = "shard.revocation"
    job_id: str
    shard_index: int
    node_id: str
    attempt: int
    term: int
    reason: RevocationReason
    message: str = Field(default="", description="what happened, for people: the reason's details")


class ShardStopRequest(Event):
    """Checkpoint and stop (preemption): the notice. The shards stop together as soon as they agree on a step, rank 0
    saves; the gang is revoked at the notice's deadline (``JobPreempting.deadline_s``) if it has not stopped."""

    type: Literal["shard.stop_request"] = "shard.stop_request"
    job_id: str
    shard_index: int
    node_id: str
    attempt: int
    term: int
    reason: StopReason
    message: str = Field(default="", description="what happened, for people: the reason's details")


AssignmentEvent = Annotated[ShardAssignment | ShardRevocation | ShardStopRequest, Field(discriminator="type")]


class ShardStarted(Event):
    type: Literal["shard.started"] = "shard.started"
    job_id: str
    shard_index: int
    attempt: int
    node_id: str
    pid: int


class ShardProgress(Event):
    type: Literal["shard.progress"] = "shard.progress"
    job_id: str
    shard_index: int
    attempt: int
    node_id: str
    step: int
    loss: float
    samples_per_s: float
    allreduce_ms: float
    allreduce_bytes: int
    syncs: int
    cpu_percent: float
    step_ms: float = 0.0
    """Mean wall time of a step since the previous report (0: not reported, a shard of an earlier version)."""
    compute_ms: float = 0.0
    """Mean time of a step since the previous report that was this rank's own: its wait on the gang's collectives
    left out. The ranks of a synchronous gang share ``step_ms``; the straggler is the one whose ``compute_ms`` is the
    longest (``shardyard.stragglers``)."""


class ShardCompleted(Event):
    type: Literal["shard.completed"] = "shard.completed"
    job_id: str
    shard_index: int
    attempt: int
    node_id: str
    final_loss: float | None
    steps: int | None
    checkpoint_dir: str | None


class ShardFailed(Event):
    type: Literal["shard.failed"] = "shard.failed"
    job_id: str
    shard_index: int
    attempt: int
    node_id: str
    cause: FailureCause
    exit_code: int | None
    message: str


class ShardCheckpointed(Event):
    """Rank 0 wrote the gang's state at ``step`` to ``checkpoint_dir`` (a job path): recovery resumes from here."""

    type: Literal["shard.checkpointed"] = "shard.checkpointed"
    job_id: str
    shard_index: int
    attempt: int
    node_id: str
    step: int = Field(ge=0)
    checkpoint_dir: str


class ShardPreempted(Event):
    """The shard stopped on a stop request; ``checkpoint_dir`` (job path) holds the gang's state at ``step``."""

    type: Literal["shard.preempted"] = "shard.preempted"
    job_id: str
    shard_index: int
    attempt: int
    node_id: str
    step: int | None
    checkpoint_dir: str | None


ShardEvent = Annotated[
    ShardStarted | ShardProgress | ShardCheckpointed | ShardCompleted | ShardFailed | ShardPreempted,
    Field(discriminator="type"),
]
