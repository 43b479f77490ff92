"""Admission: a submission's bytes become an accepted job spec or a typed rejection. Pure: no I/O, no clock.

A submission is judged in this order, and every step answers with a typed rejection:

1. **bounds before parsing** (``Limits``): its size (``TOO_LARGE``), then, by one scan of its structure that skips
   string contents, its nesting depth and its number of values (``TOO_DEEP``, ``TOO_MANY_FIELDS``). Nothing larger
   or deeper ever reaches the JSON parser or the validator;
2. **JSON and the schema** (``JobSubmission``): types, ranges, lengths, path syntax;
3. **the operator's policy** (``Policy``): job paths under an allowed prefix (``PATH_NOT_ALLOWED``), environment
   names that change how programs load code refused unless allowed (``ENV_NOT_ALLOWED``), the GPU catalogue.

A rejection is itself bounded (``bounded``): it names at most ``MAX_FIELD_ERRORS`` fields and quotes short excerpts,
so it always fits on the bus however large or broken the submission was.
"""

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any, Final

from pydantic import ValidationError

from shardyard.events import FieldError, JobSpec, JobSubmission, RejectReason
from shardyard.events.job import Elasticity, Entrypoint
from shardyard.events.submission import JOB_ID_PATTERN, GpuRequirement, SubmittedEntrypoint
from shardyard.gpus import canonical_model

MAX_SUBMISSION_BYTES: Final = 256 * 1024
"""A submission's size at most: the S15 document is under 1 KiB; a command with its arguments and environment fits
many times over."""
MAX_DEPTH: Final = 16
"""Nesting of objects and arrays at most: the schema's deepest value is 4 levels down."""
MAX_VALUES: Final = 20_000
"""Object members and array items at most, over the whole document (an entrypoint's 4,096 arguments and 1,024
variables fit)."""
MAX_FIELD_ERRORS: Final = 20
"""Field errors a rejection lists at most; the count of the others is given."""
MAX_MESSAGE_CHARS: Final = 2000
MAX_EXCERPT_CHARS: Final = 200
MAX_FIELD_CHARS: Final = 256

LOADER_ENV: Final = frozenset(
    {
        "PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONEXECUTABLE",
        "PYTHONINSPECT",
        "BASH_ENV",
        "ENV",
        "IFS",
        "GCONV_PATH",
        "PERL5LIB",
        "PERL5OPT",
        "PERLLIB",
        "RUBYLIB",
        "RUBYOPT",
        "NODE_OPTIONS",
        "NODE_PATH",
        "JAVA_TOOL_OPTIONS",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
    }
)
"""Environment names a job may not set unless the operator allows them: they change which code a program loads (the
dynamic loader, interpreters' search paths and start-up files, the shell) or which GPUs it sees."""
LOADER_ENV_PREFIXES: Final = ("LD_", "DYLD_")
"""Prefixes of the same: the dynamic loader's ``LD_PRELOAD``, ``LD_LIBRARY_PATH``, ``LD_AUDIT``..."""
DEFAULT_PATH_PREFIXES: Final = ("/data",)
"""Job-path prefixes allowed by default: the one the local cluster's agents mount."""

_PYDANTIC_REASON = {
    "missing": RejectReason.MISSING_FIELD,
    "extra_forbidden": RejectReason.UNKNOWN_FIELD,
}
_ID_RE = re.compile(JOB_ID_PATTERN)


@dataclass(frozen=True)
class Limits:
    """Bounds a submission's bytes are held to before they are parsed."""

    max_bytes: int = MAX_SUBMISSION_BYTES
    max_depth: int = MAX_DEPTH
    max_values: int = MAX_VALUES


@dataclass(frozen=True)
class Policy:
    """What the operator allows beyond the schema: where job paths may point, and environment names jobs may set
    although they change how code is loaded. ``path_prefixes`` empty: any absolute path."""

    path_prefixes: tuple[str, ...] = DEFAULT_PATH_PREFIXES
    allowed_env: frozenset[str] = field(default_factory=frozenset)
    limits: Limits = Limits()

    def path_allowed(self, path: str) -> bool:
        if not self.path_prefixes:
            return True
        job = PurePosixPath(path)
        return any(job == PurePosixPath(p) or PurePosixPath(p) in job.parents for p in self.path_prefixes)

    def env_allowed(self, name: str) -> bool:
        return name in self.allowed_env or not (name in LOADER_ENV or name.startswith(LOADER_ENV_PREFIXES))


LIMITS: Final = Limits()
ANY_PATH: Final = Policy(path_prefixes=())
"""The policy of a bare ``admit``: the limits and the loader-environment rule, any absolute job path."""


@dataclass(frozen=True)
class Admitted:
    spec: JobSpec


@dataclass(frozen=True)
class Refused:
    job_id: str
    reason: RejectReason
    message: str
    errors: tuple[FieldError, ...] = ()


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_STRUCTURE = re.compile(rb"[\[\]{},:]")


def over_limits(raw: bytes, limits: Limits) -> tuple[RejectReason, str] | None:
    """Why ``raw`` is refused before parsing, or None. Depth and value counts come from one scan of the structural
    characters outside strings (string contents are skipped by a regular expression, not walked), so a 10,000-deep
    document costs a pass over its bytes, never the parser's recursion."""
    if len(raw) > limits.max_bytes:
        return RejectReason.TOO_LARGE, f"the submission is {len(raw)} bytes; the limit is {limits.max_bytes}"
    outside = _STRING.sub(b'""', raw)
    open_arrays: list[bool] = []  # per open container: is it an array?
    values = 0
    for char in _STRUCTURE.findall(outside):
        if char in (b"[", b"{"):
            open_arrays.append(char == b"[")
            if len(open_arrays) > limits.max_depth:
                return RejectReason.TOO_DEEP, f"the submission nests deeper than {limits.max_depth} levels"
            values += char == b"["  # an array's first item (an empty one counts too: it is cheap either way)
        elif char in (b"]", b"}"):
            if open_arrays:
                open_arrays.pop()
        elif char == b":" or (open_arrays and open_arrays[-1]):
            values += 1  # an object member, or an array's next item
        if values > limits.max_values:
            return RejectReason.TOO_MANY_FIELDS, f"the submission has more than {limits.max_values} values"
    return None


def bounded(refused: "Refused") -> "Refused":
    """``refused`` cut to sizes that always fit on the bus: a short message, at most ``MAX_FIELD_ERRORS`` field
    errors (the last one counts the rest), each with a short field name and excerpt."""
    errors = [
        FieldError(
            field=_cut(error.field, MAX_FIELD_CHARS),
            problem=_cut(error.problem, MAX_EXCERPT_CHARS),
            input=None if error.input is None else _cut(error.input, MAX_EXCERPT_CHARS),
        )
        for error in refused.errors[:MAX_FIELD_ERRORS]
    ]
    if len(refused.errors) > MAX_FIELD_ERRORS:
        left = len(refused.errors) - MAX_FIELD_ERRORS
        errors.append(FieldError(field="(more)", problem=f"{left} more field errors not listed"))
    return Refused(refused.job_id, refused.reason, _cut(refused.message, MAX_MESSAGE_CHARS), tuple(errors))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _reason_of(error_type: str) -> RejectReason:
    if error_type in _PYDANTIC_REASON:
        return _PYDANTIC_REASON[error_type]
    if error_type.endswith("_type") or error_type.endswith("_parsing") or error_type == "model_attributes_type":
        return RejectReason.WRONG_TYPE
    return RejectReason.INVALID_VALUE


def _field_errors(exc: ValidationError) -> tuple[FieldError, ...]:
    errors = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(part) for part in err["loc"]) or "(root)"
        shown = None if err["type"] == "missing" else json.dumps(err.get("input"), default=str)[:200]
        message = err["msg"].removeprefix("Value error, ")
        errors.append(FieldError(field=where, problem=f"{err['type']}: {message}", input=shown))
    return tuple(errors)


def _job_id_of(document: Any, fallback: str) -> str:
    if isinstance(document, dict):
        task_id = document.get("task_id")
        if isinstance(task_id, str) and _ID_RE.match(task_id):
            return task_id
    return fallback


_NAMED_IN_TEXT = re.compile(rb'"task_id"\s*:\s*"([^"\\]{1,200})"')
"""A ``task_id`` in bytes that are not JSON (a document with ``//`` comments, a trailing comma): its first string."""


def named_job(raw: bytes, limits: Limits = LIMITS) -> str | None:
    """The job a submission names: its ``task_id`` when the bytes are a JSON object within the limits with a usable
    one, or, in bytes within the limits that do not parse, the first ``"task_id": "..."`` that is a usable id (so
    that the seed's commented example is rejected under its own name); else None. Every decision about that job
    (acceptance, rejection, duplicate) is made by one queue replica, the owner of the job's submissions partition;
    bytes over the limits are refused wherever they are read (they are never forwarded)."""
    if over_limits(raw, limits) is not None:
        return None
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        found = _NAMED_IN_TEXT.search(raw)
        text = found.group(1).decode(errors="replace") if found else ""
        return text if _ID_RE.match(text) else None
    job_id = _job_id_of(document, "")
    return job_id or None


def rejection_id(raw: bytes, key: bytes | None, fallback: str, limits: Limits = LIMITS) -> str:
    """The id a submission's rejection is filed under: the job its bytes name (``named_job``), else the message key
    when it is a usable id (``shardyard submit`` and other producers key a submission by its ``task_id``), else
    ``fallback`` (``invalid-PARTITION-OFFSET``)."""
    named = named_job(raw, limits)
    if named is not None:
        return named
    keyed = key.decode(errors="replace") if key else ""
    return keyed if _ID_RE.match(keyed) else fallback


def admit(
    raw: bytes,
    *,
    catalogue: Mapping[str, float],
    submitted_at: datetime,
    fallback_id: str,
    policy: Policy = ANY_PATH,
) -> Admitted | Refused:
    """Validate ``raw`` (the S15 JSON) against the limits, the schema, the operator's policy and the GPU catalogue.

    ``fallback_id`` names the rejection when the bytes carry no usable ``task_id``. The result is bounded.
    """
    result = _admit(raw, catalogue=catalogue, submitted_at=submitted_at, fallback_id=fallback_id, policy=policy)
    return result if isinstance(result, Admitted) else bounded(result)


def _admit(
    raw: bytes, *, catalogue: Mapping[str, float], submitted_at: datetime, fallback_id: str, policy: Policy
) -> Admitted | Refused:
    document = _document(raw, fallback_id, policy.limits)
    if isinstance(document, Refused):
        return document
    job_id = _job_id_of(document, fallback_id)
    try:
        submission = JobSubmission.model_validate(document)
    except ValidationError as exc:
        return _invalid(job_id, exc)
    refused = _against_policy(job_id, submission, policy)
    if refused is not None:
        return refused
    gpu = submission.resource_requirements.gpu
    model = canonical_model(gpu.model) if gpu.model else None
    min_tflops = _min_tflops(job_id, gpu, model, catalogue)
    if isinstance(min_tflops, Refused):
        return min_tflops
    return Admitted(_spec(submission, model=model, min_tflops=min_tflops, submitted_at=submitted_at))


def _document(raw: bytes, fallback_id: str, limits: Limits) -> dict[str, Any] | Refused:
    """The submission as a JSON object, bounded before it is parsed; refused under ``fallback_id``, since bytes that
    are not such an object name no job."""
    over = over_limits(raw, limits)
    if over is not None:
        return Refused(fallback_id, *over)
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or an integer of over 4,300 digits
        return Refused(fallback_id, RejectReason.MALFORMED_JSON, f"the submission is not JSON: {str(exc)[:200]}")
    if not isinstance(document, dict):
        return Refused(
            fallback_id, RejectReason.NOT_AN_OBJECT, f"a submission is a JSON object, got {type(document).__name__}"
        )
    return document


def _invalid(job_id: str, exc: ValidationError) -> Refused:
    """A schema failure: every field error listed, the reason the first one's (a shard count other than the GPU
    count named as such)."""
    errors = _field_errors(exc)
    first = exc.errors(include_url=False)[0]
    reason = _reason_of(first["type"])
    if first["type"] == "value_error" and "shard_count" in first["msg"]:
        reason = RejectReason.SHARD_COUNT_MISMATCH
    summary = "; ".join(f"{e.field}: {e.problem.split(': ', 1)[-1]}" for e in errors[:5])
    return Refused(job_id, reason, f"invalid submission: {summary}", errors)


def _min_tflops(job_id: str, gpu: GpuRequirement, model: str | None, catalogue: Mapping[str, float]) -> float | Refused:
    """The TFLOPS a GPU must have for the job: as asked, else the named model's from the catalogue, else none (0).
    A model the catalogue does not know is refused: without its figure no GPU could be judged against it."""
    if gpu.min_flops is not None:
        return gpu.min_flops
    if model is None:
        return 0.0
    if model in catalogue:
        return catalogue[model]
    known = ", ".join(sorted(catalogue))
    return Refused(
        job_id,
        RejectReason.UNKNOWN_GPU_MODEL,
        f"GPU model {gpu.model!r} is not in the catalogue ({known}); name a known model or give min_flops",
        (FieldError(field="resource_requirements.gpu.model", problem="unknown GPU model", input=gpu.model),),
    )


def _spec(submission: JobSubmission, *, model: str | None, min_tflops: float, submitted_at: datetime) -> JobSpec:
    """The accepted job: the submission's fields under the spec's names, with its defaults filled in."""
    gpu = submission.resource_requirements.gpu
    return JobSpec(
        job_id=submission.task_id,
        task_type=submission.task_type,
        priority=submission.priority,
        gpu_count=gpu.count,
        gpu_model=model,
        min_tflops=min_tflops,
        memory_bytes=submission.resource_requirements.memory,
        cpu_cores=submission.resource_requirements.cpu_cores,
        model_path=submission.dependencies.pretrained_model,
        dataset_path=submission.dependencies.dataset,
        shard_count=submission.shard_count or gpu.count,
        sync_interval=submission.sync_interval,
        **submission.training.model_dump(),
        submitted_at=submitted_at,
        depends_on=tuple(dict.fromkeys(submission.depends_on)),  # order kept, repeats dropped
        on_dependency_failure=submission.on_dependency_failure,
        min_match=submission.placement.min_match if submission.placement else None,
        max_wait_s=submission.placement.max_wait_s if submission.placement else 0.0,
        preemptible=submission.preemptible,
        entrypoint=_entrypoint(submission.entrypoint),
        expected_duration_s=submission.expected_duration_s,
        owner=submission.owner,
        queue=submission.queue,
        elasticity=None if (sizes := submission.elasticity) is None else Elasticity(**sizes.model_dump()),
    )


def _against_policy(job_id: str, submission: JobSubmission, policy: Policy) -> Refused | None:
    paths = {
        "dependencies.pretrained_model": submission.dependencies.pretrained_model,
        "dependencies.dataset": submission.dependencies.dataset,
    }
    entrypoint = submission.entrypoint
    if entrypoint is not None and entrypoint.working_dir is not None:
        paths["entrypoint.working_dir"] = entrypoint.working_dir
    outside = [
        FieldError(field=where, problem="not under an allowed job-path prefix", input=path[:MAX_EXCERPT_CHARS])
        for where, path in paths.items()
        if not policy.path_allowed(path)
    ]
    if outside:
        allowed = ", ".join(policy.path_prefixes)
        named = ", ".join(error.field for error in outside)
        return Refused(
            job_id,
            RejectReason.PATH_NOT_ALLOWED,
            f"{named}: job paths must lie under {allowed} (the prefixes the operator allows)",
            tuple(outside),
        )
    refused_env = [name for name in (entrypoint.env if entrypoint else {}) if not policy.env_allowed(name)]
    if refused_env:
        return Refused(
            job_id,
            RejectReason.ENV_NOT_ALLOWED,
            f"entrypoint.env: {', '.join(_sample(refused_env))} change how programs load code or which GPUs they "
            "see; the operator has not allowed them",
            tuple(FieldError(field=f"entrypoint.env.{name}", problem="not allowed") for name in refused_env),
        )
    return None


def _sample(names: Iterable[str], shown: int = 5) -> list[str]:
    names = list(names)
    return names[:shown] + ([f"and {len(names) - shown} more"] if len(names) > shown else [])


def _entrypoint(submitted: SubmittedEntrypoint | None) -> Entrypoint | None:
    if submitted is None:
        return None
    return Entrypoint(command=submitted.command, env=submitted.env, working_dir=submitted.working_dir)
