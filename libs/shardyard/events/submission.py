"""The job submission users produce to Kafka (S15), accepted verbatim as plain JSON.

Parsing is strict about types (``"count": "two"`` is refused, not guessed) and about unknown fields (a typo is an
error, not a silently ignored option), and lenient where the documented JSON is: ``"memory": "64GiB"``.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from shardyard.events.job import Entrypoint
from shardyard.units import parse_bytes

JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


def _bytes(value: object) -> int:
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise ValueError("a memory size must be a number of bytes or a string like '64GiB'")
    return parse_bytes(value)


ByteCount = Annotated[
    int,
    BeforeValidator(_bytes),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*([KMGT]i?B?|B)?\s*$"},
            ],
            "description": "bytes, or a size like '64GiB', '512MiB', '32GB'",
        }
    ),
]


class _UserModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


class GpuRequirement(_UserModel):
    count: int = Field(ge=1, le=4096, description="GPUs for the whole job; one shard per GPU")
    model: str | None = Field(default=None, min_length=1, description="GPU model, e.g. A100; none means any")
    min_flops: float | None = Field(default=None, gt=0, description="minimum TFLOPS per GPU")


class ResourceRequirements(_UserModel):
    gpu: GpuRequirement
    memory: ByteCount = Field(default=0, description="host memory for the whole job, e.g. '64GiB'")
    cpu_cores: float = Field(default=1, gt=0, le=100_000, description="CPU cores for the whole job")


class Dependencies(_UserModel):
    pretrained_model: str = Field(min_length=1, description="directory of the pretrained checkpoint")
    dataset: str = Field(min_length=1, description="directory of the training text")


class TrainingParams(_UserModel):
    """Knobs of the built-in fine-tune runner; every one has a default."""

    max_steps: int = Field(default=300, ge=1, le=10_000_000)
    batch_size: int = Field(default=8, ge=1, le=65_536)
    seq_len: int = Field(default=64, ge=2, le=1_000_000)
    lr: float = Field(default=3e-3, gt=0, le=10)
    seed: int = Field(default=0, ge=0)


class PlacementOptions(_UserModel):
    """Opt-in degraded placement: after ``max_wait_s`` without a full match, accept GPUs scoring ``min_match``."""

    min_match: float = Field(gt=0, le=1, description="lowest match score (node TFLOPS / required) accepted")
    max_wait_s: float = Field(default=0, ge=0, le=30 * 86_400, description="wait this long for a full match first")


class JobSubmission(_UserModel):
    task_id: str = Field(pattern=JOB_ID_PATTERN)
    task_type: str = Field(default="micro_train", min_length=1, max_length=64)
    resource_requirements: ResourceRequirements
    priority: int = Field(default=0, ge=0, le=1000)
    dependencies: Dependencies
    shard_count: int | None = Field(default=None, ge=1, le=4096, description="defaults to the GPU count")
    sync_interval: int = Field(default=100, ge=1, le=10_000_000, description="steps between parameter AllReduces")
    training: TrainingParams = Field(default_factory=TrainingParams)
    depends_on: list[Annotated[str, Field(pattern=JOB_ID_PATTERN)]] = Field(
        default_factory=list, max_length=256, description="job ids that must succeed before this job is ready"
    )
    on_dependency_failure: Literal["fail", "hold"] = Field(
        default="fail", description="when a parent fails: fail this job too, or hold it (WAITING) with the reason"
    )
    placement: PlacementOptions | None = Field(default=None, description="degraded placement, off unless given")
    preemptible: bool = Field(default=True, description="a higher-priority job may checkpoint and requeue this one")
    entrypoint: Entrypoint | None = Field(
        default=None, description="run this command once per shard (torchrun environment), not the built-in runner"
    )

    @model_validator(mode="after")
    def _one_gpu_per_shard(self) -> "JobSubmission":
        if self.shard_count is not None and self.shard_count != self.resource_requirements.gpu.count:
            raise ValueError(
                f"shard_count ({self.shard_count}) must equal resource_requirements.gpu.count "
                f"({self.resource_requirements.gpu.count}): each shard runs on one GPU"
            )
        if self.task_id in self.depends_on:
            raise ValueError(f"depends_on: job {self.task_id!r} cannot depend on itself")
        return self
