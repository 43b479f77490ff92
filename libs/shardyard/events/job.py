"""Job lifecycle events, published on the lifecycle topic keyed by job id, and the normalised job spec."""

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from shardyard.events.base import AwareDatetime, Event, Model


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

    @property
    def memory_per_shard(self) -> int:
        return -(-self.memory_bytes // self.shard_count)

    @property
    def cpu_per_shard(self) -> float:
        return self.cpu_cores / self.shard_count


class RejectReason(StrEnum):
    MALFORMED_JSON = "MALFORMED_JSON"
    NOT_AN_OBJECT = "NOT_AN_OBJECT"
    MISSING_FIELD = "MISSING_FIELD"
    WRONG_TYPE = "WRONG_TYPE"
    UNKNOWN_FIELD = "UNKNOWN_FIELD"
    INVALID_VALUE = "INVALID_VALUE"
    UNKNOWN_GPU_MODEL = "UNKNOWN_GPU_MODEL"
    SHARD_COUNT_MISMATCH = "SHARD_COUNT_MISMATCH"
    DUPLICATE_JOB = "DUPLICATE_JOB"


class FieldError(Model):
    field: str
    problem: str
    input: str | None = None


class PendingReason(StrEnum):
    NO_NODES = "NO_NODES"
    NO_FIT = "NO_FIT"
    GPU_MODEL_MISMATCH = "GPU_MODEL_MISMATCH"
    INSUFFICIENT_TFLOPS = "INSUFFICIENT_TFLOPS"
    INSUFFICIENT_GPUS = "INSUFFICIENT_GPUS"


class FailureCause(StrEnum):
    PROCESS_EXIT = "PROCESS_EXIT"
    KILLED = "KILLED"
    USER_ERROR = "USER_ERROR"
    COMM_ERROR = "COMM_ERROR"
    NODE_LOST = "NODE_LOST"
    MISSING_ARTIFACT = "MISSING_ARTIFACT"
    LAUNCH_ERROR = "LAUNCH_ERROR"


class ShardPlacement(Model):
    shard_index: int
    node_id: str
    gpu_indices: tuple[int, ...]
    gpu_model: str
    match_score: float


class JobAccepted(Event):
    type: Literal["job.accepted"] = "job.accepted"
    job_id: str
    spec: JobSpec
    source_offset: str = Field(description="topic/partition/offset of the submission, for idempotent admission")


class JobRejected(Event):
    type: Literal["job.rejected"] = "job.rejected"
    job_id: str
    reason: RejectReason
    message: str
    errors: tuple[FieldError, ...] = ()
    source_offset: str


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


class JobScheduled(Event):
    type: Literal["job.scheduled"] = "job.scheduled"
    job_id: str
    attempt: int
    term: int
    coordinator_node: str
    rendezvous_port: int
    placements: tuple[ShardPlacement, ...]


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


class ShardCause(Model):
    shard_index: int
    node_id: str
    cause: FailureCause
    message: str


class JobFailed(Event):
    type: Literal["job.failed"] = "job.failed"
    job_id: str
    attempt: int
    cause: FailureCause
    message: str
    causes: tuple[ShardCause, ...] = ()


JobLifecycleEvent = Annotated[
    JobAccepted | JobRejected | JobReady | JobUnschedulable | JobScheduled | JobRunning | JobSucceeded | JobFailed,
    Field(discriminator="type"),
]
