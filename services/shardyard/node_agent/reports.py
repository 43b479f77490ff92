"""What a shard's start, its reports and its end mean, as the events that tell the cluster: started, progress, a
checkpoint named by its job path, and the end (completed, preempted with a checkpoint, or failed with a cause).
Pure: time comes in."""

from collections.abc import Mapping
from datetime import datetime, timedelta

from shardyard.events import (
    Event,
    FailureCause,
    ShardAssignment,
    ShardCheckpointed,
    ShardCompleted,
    ShardFailed,
    ShardPreempted,
    ShardProgress,
    ShardStarted,
)
from shardyard.node_agent.disk import storage_failure
from shardyard.node_agent.redaction import redact, secrets_of
from shardyard.training.exitcodes import ExitCause, classify_exit
from shardyard.training.preemption import checkpoint_job_path
from shardyard.training.storage import Space

MAX_AGO_S = 600.0
"""The furthest back a progress report is dated (its ``at``, the shard's word, on this node's clock): a line the
agent reads late (it was paused), or the last step before a failure, which a rank tells once its sync has failed,
at most its sync timeout later."""

ShardKey = tuple[str, int, int]
"""(job id, shard index, attempt): a shard attempt runs at most once."""

_CAUSE = {
    ExitCause.USER_ERROR: FailureCause.USER_ERROR,
    ExitCause.COMM_ERROR: FailureCause.COMM_ERROR,
    ExitCause.KILLED: FailureCause.KILLED,
    ExitCause.PROCESS_EXIT: FailureCause.PROCESS_EXIT,
    ExitCause.OOM: FailureCause.OOM,
    ExitCause.GPU_FAULT: FailureCause.GPU_FAULT,
    ExitCause.SYNC_TIMEOUT: FailureCause.SYNC_TIMEOUT,
    ExitCause.FENCED: FailureCause.FENCED,
    ExitCause.DISK_FULL: FailureCause.DISK_FULL,
    ExitCause.IO_ERROR: FailureCause.IO_ERROR,
}


def number(report: Mapping[str, object], name: str) -> float:
    """A numeric field of a shard's report; 0 when it is missing or not a number (a report is the shard's word)."""
    value = report.get(name, 0)
    return float(value) if isinstance(value, int | float) else 0.0


def _step(value: object) -> int | None:
    """A reported step: an int that is not a bool; None for anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def started(node_id: str, key: ShardKey, pid: int, *, now: datetime) -> ShardStarted:
    job_id, shard_index, attempt = key
    return ShardStarted(
        occurred_at=now, job_id=job_id, shard_index=shard_index, attempt=attempt, node_id=node_id, pid=pid
    )


def progress(node_id: str, key: ShardKey, report: Mapping[str, object], *, now: datetime) -> ShardProgress:
    """A ``progress`` report as its event, dated when its step ended (its ``at``, within ``MAX_AGO_S`` before
    ``now`` and never after it; ``now`` without one); a field missing or not a number counts as 0."""
    job_id, shard_index, attempt = key
    at = number(report, "at")
    ago = min(max(0.0, now.timestamp() - at), MAX_AGO_S) if at > 0 else 0.0
    return ShardProgress(
        occurred_at=now - timedelta(seconds=ago),
        job_id=job_id,
        shard_index=shard_index,
        attempt=attempt,
        node_id=node_id,
        step=int(number(report, "step")),
        loss=number(report, "loss"),
        samples_per_s=number(report, "samples_per_s"),
        allreduce_ms=number(report, "allreduce_ms"),
        allreduce_bytes=int(number(report, "allreduce_bytes")),
        syncs=int(number(report, "syncs")),
        cpu_percent=number(report, "cpu_percent"),
        step_ms=number(report, "step_ms"),
        compute_ms=number(report, "compute_ms"),
    )


def checkpointed(
    node_id: str, key: ShardKey, assignment: ShardAssignment, report: Mapping[str, object], *, now: datetime
) -> ShardCheckpointed | None:
    """A ``checkpointed`` report as an event naming the checkpoint by its job path; None when it is malformed."""
    step = _step(report.get("step"))
    if step is None or step < 0:
        return None
    job_id, shard_index, attempt = key
    return ShardCheckpointed(
        occurred_at=now,
        job_id=job_id,
        shard_index=shard_index,
        attempt=attempt,
        node_id=node_id,
        step=step,
        checkpoint_dir=checkpoint_job_path(assignment.workload.output_path),
    )


def ended(
    node_id: str,
    key: ShardKey,
    assignment: ShardAssignment,
    returncode: int | None,
    *,
    now: datetime,
    final: Mapping[str, object],
    message: str,
    cause: FailureCause | None = None,
    fenced: str | None = None,
    gpu_fault: str | None = None,
    space: Space | None = None,
) -> Event:
    """The event that reports a shard's end. ``cause`` is the agent's own (the shard never started); else the exit
    code says it, unless the agent stopped the shard: for a lost lease (``fenced``) or a faulted GPU (``gpu_fault``,
    which wins), the shard is reported failed for that, with that message, whatever it died of. A full or failing
    disk is read from the exit code, the shard's last report, its log and ``space``, the free space of its output
    disk as it exited (:func:`~shardyard.node_agent.disk.storage_failure`)."""
    entrypoint = assignment.workload.entrypoint
    message = message if entrypoint is None else redact(message, secrets_of(entrypoint.env))
    if cause is not None or returncode is None:
        return _failed(node_id, key, now, cause or FailureCause.PROCESS_EXIT, returncode, message)
    exit_cause = classify_exit(returncode)
    if exit_cause is ExitCause.OK:
        return _completed(node_id, key, now, assignment, final)
    if exit_cause is ExitCause.PREEMPTED:
        return _preempted(node_id, key, now, assignment, final)
    if gpu_fault is not None:  # the hardware's fault, whoever stopped it
        return _failed(node_id, key, now, FailureCause.GPU_FAULT, returncode, gpu_fault)
    if fenced is not None:  # whatever it died of, we stopped it
        return _failed(node_id, key, now, FailureCause.FENCED, returncode, fenced)
    storage = storage_failure(exit_cause, returncode, message, final, space)
    if storage is not None:
        return _failed(node_id, key, now, storage[0], returncode, storage[1])
    return _failed(node_id, key, now, _CAUSE[exit_cause], returncode, message)


def _completed(
    node_id: str, key: ShardKey, now: datetime, assignment: ShardAssignment, final: Mapping[str, object]
) -> ShardCompleted:
    job_id, shard_index, attempt = key
    loss = final.get("final_loss")
    steps = final.get("steps")
    return ShardCompleted(
        occurred_at=now,
        job_id=job_id,
        shard_index=shard_index,
        attempt=attempt,
        node_id=node_id,
        final_loss=float(loss) if isinstance(loss, int | float) else None,
        steps=int(steps) if isinstance(steps, int) else None,
        checkpoint_dir=assignment.workload.output_path,
    )


def _preempted(
    node_id: str, key: ShardKey, now: datetime, assignment: ShardAssignment, final: Mapping[str, object]
) -> ShardPreempted:
    """The runner exits PREEMPTED only once rank 0's checkpoint is complete, report or not."""
    job_id, shard_index, attempt = key
    return ShardPreempted(
        occurred_at=now,
        job_id=job_id,
        shard_index=shard_index,
        attempt=attempt,
        node_id=node_id,
        step=_step(final.get("step")) if final.get("kind") == "preempted" else None,
        checkpoint_dir=checkpoint_job_path(assignment.workload.output_path),
    )


def _failed(
    node_id: str, key: ShardKey, now: datetime, cause: FailureCause, returncode: int | None, message: str
) -> ShardFailed:
    job_id, shard_index, attempt = key
    return ShardFailed(
        occurred_at=now,
        job_id=job_id,
        shard_index=shard_index,
        attempt=attempt,
        node_id=node_id,
        cause=cause,
        exit_code=returncode,
        message=message,
    )
