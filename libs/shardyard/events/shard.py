"""Assignments (scheduler -> agent, keyed by node) and shard events (agent -> everyone, keyed by job)."""

from typing import Annotated, Literal

from pydantic import Field

from shardyard.events.base import Event, Model
from shardyard.events.job import Entrypoint, FailureCause


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


class ShardRevocation(Event):
    type: Literal["shard.revocation"] = "shard.revocation"
    job_id: str
    shard_index: int
    node_id: str
    attempt: int
    term: int
    reason: str


class ShardStopRequest(Event):
    """Checkpoint and stop (preemption): the shards stop together at their next parameter sync, rank 0 saves."""

    type: Literal["shard.stop_request"] = "shard.stop_request"
    job_id: str
    shard_index: int
    node_id: str
    attempt: int
    term: int
    reason: str


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
