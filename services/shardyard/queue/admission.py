"""Admission: a submission's bytes become an accepted job spec or a typed rejection. Pure: no I/O, no clock."""

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from shardyard.events import FieldError, JobSpec, JobSubmission, RejectReason
from shardyard.events.submission import JOB_ID_PATTERN
from shardyard.gpus import canonical_model

_PYDANTIC_REASON = {
    "missing": RejectReason.MISSING_FIELD,
    "extra_forbidden": RejectReason.UNKNOWN_FIELD,
}
_ID_RE = re.compile(JOB_ID_PATTERN)


@dataclass(frozen=True)
class Admitted:
    spec: JobSpec


@dataclass(frozen=True)
class Refused:
    job_id: str
    reason: RejectReason
    message: str
    errors: tuple[FieldError, ...] = ()


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


def named_job(raw: bytes) -> str | None:
    """The job a submission names: its ``task_id`` when the bytes are a JSON object with a usable one, else None.
    Every decision about that job (acceptance, rejection, duplicate) is made by one queue replica, the owner of the
    job's submissions partition."""
    try:
        document = json.loads(raw)
    except ValueError:
        return None
    job_id = _job_id_of(document, "")
    return job_id or None


def admit(
    raw: bytes, *, catalogue: Mapping[str, float], submitted_at: datetime, fallback_id: str
) -> Admitted | Refused:
    """Validate ``raw`` (the S15 JSON) against the schema and the GPU catalogue.

    ``fallback_id`` names the rejection when the bytes carry no usable ``task_id``.
    """
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Refused(fallback_id, RejectReason.MALFORMED_JSON, f"the submission is not JSON: {exc}")
    if not isinstance(document, dict):
        return Refused(
            fallback_id, RejectReason.NOT_AN_OBJECT, f"a submission is a JSON object, got {type(document).__name__}"
        )
    job_id = _job_id_of(document, fallback_id)
    try:
        submission = JobSubmission.model_validate(document)
    except ValidationError as exc:
        errors = _field_errors(exc)
        first = exc.errors(include_url=False)[0]
        reason = _reason_of(first["type"])
        if first["type"] == "value_error" and "shard_count" in first["msg"]:
            reason = RejectReason.SHARD_COUNT_MISMATCH
        summary = "; ".join(f"{e.field}: {e.problem.split(': ', 1)[-1]}" for e in errors[:5])
        return Refused(job_id, reason, f"invalid submission: {summary}", errors)

    gpu = submission.resource_requirements.gpu
    model = canonical_model(gpu.model) if gpu.model else None
    if gpu.min_flops is not None:
        min_tflops = gpu.min_flops
    elif model is None:
        min_tflops = 0.0
    elif model in catalogue:
        min_tflops = catalogue[model]
    else:
        known = ", ".join(sorted(catalogue))
        return Refused(
            job_id,
            RejectReason.UNKNOWN_GPU_MODEL,
            f"GPU model {gpu.model!r} is not in the catalogue ({known}); name a known model or give min_flops",
            (FieldError(field="resource_requirements.gpu.model", problem="unknown GPU model", input=gpu.model),),
        )
    training = submission.training
    spec = JobSpec(
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
        max_steps=training.max_steps,
        batch_size=training.batch_size,
        seq_len=training.seq_len,
        lr=training.lr,
        seed=training.seed,
        submitted_at=submitted_at,
        depends_on=tuple(dict.fromkeys(submission.depends_on)),  # order kept, repeats dropped
        on_dependency_failure=submission.on_dependency_failure,
        min_match=submission.placement.min_match if submission.placement else None,
        max_wait_s=submission.placement.max_wait_s if submission.placement else 0.0,
        preemptible=submission.preemptible,
        entrypoint=submission.entrypoint,
    )
    return Admitted(spec)
