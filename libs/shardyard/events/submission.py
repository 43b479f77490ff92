"""The job submission users produce to Kafka (S15), accepted verbatim as plain JSON.

Parsing is strict about types (``"count": "two"`` is refused, not guessed) and about unknown fields (a typo is an
error, not a silently ignored option), and lenient where the documented JSON is: ``"memory": "64GiB"``.

Every field is bounded (the limits are in the JSON Schema, ``schemas/job-submission.json``, and
docs/users/job-document.md): numbers are finite and within their ranges, strings have lengths, and job paths are
absolute and normalised, free of ``.`` and ``..``, at most ``MAX_PATH_BYTES`` long with components of at most
``MAX_COMPONENT_BYTES``. Which prefixes a path may lie under, and which environment variables a job may set, is the
operator's (``shardyard.admission``).
"""

from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from shardyard.events.job import MAX_SEED as MAX_SEED  # re-exported: the submission limits are all here
from shardyard.events.job import Argument, EnvName, EnvValue, TrainingParams
from shardyard.quotas import DEFAULT_QUEUE as DEFAULT_QUEUE  # re-exported: submissions name it
from shardyard.units import parse_bytes

JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"

MAX_OWNER_CHARS: Final = 128
MAX_PATH_BYTES: Final = 4096
"""PATH_MAX on Linux: a longer job path cannot be opened on any node."""
MAX_COMPONENT_BYTES: Final = 255
"""NAME_MAX on Linux: a longer file name cannot exist (ENAMETOOLONG)."""
MAX_MEMORY_BYTES: Final = 2**53
"""Host memory a job may ask for, 8 PiB: above any cluster's, and exact as a float."""
MAX_TFLOPS: Final = 1_000_000.0


def _bytes(value: object) -> int:
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise ValueError("a memory size must be a number of bytes or a string like '64GiB'")
    count = parse_bytes(value)
    if count > MAX_MEMORY_BYTES:
        raise ValueError(f"a memory size is at most {MAX_MEMORY_BYTES} bytes (8 PiB)")
    return count


def job_path(value: str) -> str:
    """``value`` as a job path: absolute, normalised (repeated and trailing ``/`` dropped), without ``.`` or ``..``
    components, NUL or control characters, within Linux's length limits. Raises ValueError saying which rule broke."""
    if not value.startswith("/"):
        raise ValueError(f"a job path is absolute (starts with '/'): {value[:80]!r}")
    if any(ord(char) < 0x20 or char == "\x7f" for char in value):
        raise ValueError("a job path has no NUL or control characters")
    if len(value.encode()) > MAX_PATH_BYTES:
        raise ValueError(f"a job path is at most {MAX_PATH_BYTES} bytes")
    parts = [part for part in value.split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise ValueError(f"a job path has no '.' or '..' components: {value[:200]!r}")
    if any(len(part.encode()) > MAX_COMPONENT_BYTES for part in parts):
        raise ValueError(f"a job path's components are at most {MAX_COMPONENT_BYTES} bytes each")
    return "/" + "/".join(parts)


JobPath = Annotated[
    str,
    Field(min_length=1),
    AfterValidator(job_path),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": r"^/[^\x00-\x1f\x7f]*$",
            "maxLength": MAX_PATH_BYTES,
            "description": f"an absolute job path without '.' or '..' components, at most {MAX_PATH_BYTES} bytes, "
            f"components at most {MAX_COMPONENT_BYTES} bytes; it must lie under a prefix the operator allows "
            "(the queue's --job-path-prefixes, default /data)",
        }
    ),
]


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
    model: str | None = Field(
        default=None, min_length=1, max_length=64, description="GPU model, e.g. A100; none means any"
    )
    min_flops: float | None = Field(default=None, gt=0, le=MAX_TFLOPS, description="minimum TFLOPS per GPU")


class ResourceRequirements(_UserModel):
    gpu: GpuRequirement
    memory: ByteCount = Field(default=0, description="host memory for the whole job, e.g. '64GiB'")
    cpu_cores: float = Field(default=1, gt=0, le=100_000, description="CPU cores for the whole job")


class Dependencies(_UserModel):
    pretrained_model: JobPath = Field(description="directory of the pretrained checkpoint")
    dataset: JobPath = Field(description="directory of the training text")


class PlacementOptions(_UserModel):
    """Opt-in degraded placement: after ``max_wait_s`` without a full match, accept GPUs scoring ``min_match``."""

    min_match: float = Field(gt=0, le=1, description="lowest match score (node TFLOPS / required) accepted")
    max_wait_s: float = Field(default=0, ge=0, le=30 * 86_400, description="wait this long for a full match first")


class SubmittedElasticity(_UserModel):
    """An elastic job's range of sizes: it may start, run and be shrunk anywhere from ``min_shards`` to
    ``max_shards`` shards (one GPU each); ``shard_count`` is the size it prefers. Without it a job is rigid."""

    min_shards: int = Field(ge=1, le=4096, description="the fewest shards it runs with: its protected core")
    max_shards: int = Field(ge=1, le=4096, description="the most shards it grows to into GPUs nothing else can use")


class SubmittedEntrypoint(_UserModel):
    """A user's own training command (``shardyard.events.job.Entrypoint`` once admitted). ``command`` is an argv list
    run without a shell; ``env`` is added to the shard's environment, except the names the runtime owns and, unless
    the operator allows them, names that change how programs load code (``LD_*``, ``PYTHONPATH``, ``PATH``...);
    ``working_dir`` is a job path, confined like the dependencies."""

    command: list[Argument] = Field(min_length=1, max_length=4096, description="argv, run without a shell")
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        max_length=1024,
        description="extra environment variables: not RANK, MASTER_*, SHARDYARD_*, nor (unless the operator allows "
        "them, the queue's --allow-env) LD_*, DYLD_*, PATH, PYTHONPATH, PYTHONHOME and the like",
    )
    working_dir: JobPath | None = Field(
        default=None, description="directory the command runs in (a job path); default: the agent's"
    )


class JobSubmission(_UserModel):
    task_id: str = Field(pattern=JOB_ID_PATTERN)
    task_type: str = Field(default="micro_train", min_length=1, max_length=64)
    resource_requirements: ResourceRequirements
    priority: int = Field(default=0, ge=0, le=1000)
    owner: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_OWNER_CHARS,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="who submitted it, shown in job listings; `shardyard submit` fills in the local user name",
    )
    queue: str = Field(
        default=DEFAULT_QUEUE,
        pattern=QUEUE_PATTERN,
        description="the queue it is submitted to, shown in job listings (placement does not read it yet)",
    )
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
    expected_duration_s: float | None = Field(
        default=None,
        gt=0,
        le=365 * 86_400,
        description="how long the job is expected to run, in seconds: it may then backfill onto GPUs reserved for "
        "a later start, and its own start estimate is firmer; default: estimated from similar jobs that ended",
    )
    preemptible: bool = Field(default=True, description="a higher-priority job may checkpoint and requeue this one")
    entrypoint: SubmittedEntrypoint | None = Field(
        default=None, description="run this command once per shard (torchrun environment), not the built-in runner"
    )
    elasticity: SubmittedElasticity | None = Field(
        default=None,
        description="an elastic job: min_shards <= shard_count (its preferred size) <= max_shards; default rigid",
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
        elastic, preferred = self.elasticity, self.shard_count or self.resource_requirements.gpu.count
        if elastic is not None and not elastic.min_shards <= preferred <= elastic.max_shards:
            raise ValueError(
                f"elasticity: min_shards ({elastic.min_shards}) <= shard_count ({preferred}, the preferred size) <= "
                f"max_shards ({elastic.max_shards}) does not hold"
            )
        return self
