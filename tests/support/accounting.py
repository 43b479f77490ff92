"""Job lifecycles as the accounting service reads them, shared by its unit, service and CLI tests: a job that
succeeds, one that fails, one that succeeds on its second attempt, one cancelled while it waits, and the records
they must give."""

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from shardyard.events import (
    Event,
    FailureCause,
    JobAccepted,
    JobCancelled,
    JobFailed,
    JobReady,
    JobRecovering,
    JobRunning,
    JobScheduled,
    JobSucceeded,
    ShardPlacement,
)
from shardyard.jobdb.record import JobRecord
from shardyard.lifecycle import JobState
from tests.unit.builders import job_spec, progress


def placed(job_id: str, at: datetime, *, attempt: int = 1, gpus: int = 2, model: str = "A100") -> JobScheduled:
    """Attempt ``attempt`` on ``gpus`` GPUs of ``model``, one shard each, plus a spare (never counted)."""
    placements = [
        ShardPlacement(shard_index=i, node_id=f"n{i}", gpu_indices=(0,), gpu_model=model, match_score=1.0)
        for i in range(gpus)
    ]
    spare = ShardPlacement(
        shard_index=gpus, node_id="spare", gpu_indices=(1,), gpu_model=model, match_score=1.0, spare=True
    )
    return JobScheduled(
        occurred_at=at,
        job_id=job_id,
        attempt=attempt,
        term=1,
        coordinator_node="n0",
        rendezvous_port=29500,
        placements=(*placements, spare),
    )


def accepted(job_id: str, at: datetime, **spec: Any) -> list[Event]:
    job = job_spec(job_id=job_id, submitted_at=at, **spec)
    return [
        JobAccepted(occurred_at=at, job_id=job_id, spec=job, source_offset=f"test/0/{job_id}"),
        JobReady(occurred_at=at, job_id=job_id, spec=job),
    ]


def succeeded(job_id: str, t0: datetime) -> list[Event]:
    """Waits 10 s, is placed on 2 A100s, runs, and succeeds 3600 s after placement with loss 1.25."""
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    return [
        *accepted(job_id, t0),
        placed(job_id, at(10)),
        JobRunning(occurred_at=at(12), job_id=job_id, attempt=1),
        JobSucceeded(occurred_at=at(3610), job_id=job_id, attempt=1, final_loss=1.25, checkpoint_dir="/data/out"),
    ]


def failed(job_id: str, t0: datetime) -> list[Event]:
    """Placed at once on 2 A100s, fails its user's way 1800 s later."""
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    return [
        *accepted(job_id, t0),
        placed(job_id, at(0)),
        JobRunning(occurred_at=at(1), job_id=job_id, attempt=1),
        JobFailed(occurred_at=at(1800), job_id=job_id, attempt=1, cause=FailureCause.USER_ERROR, message="exit 1"),
    ]


def retried(job_id: str, t0: datetime) -> list[Event]:
    """Attempt 1 on 2 A100s, its first step at 10 s and step 1000 at 1790 s, loses a node at 1800 s; attempt 2, 60 s
    later on 2 V100s, resumes from the checkpoint at step 900 (its first report at 1870 s), reports step 1100 at
    1970 s (so it passed step 1000 at 1920 s), and succeeds 1800 s after its placement."""
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    return [
        *accepted(job_id, t0),
        placed(job_id, at(0)),
        JobRunning(occurred_at=at(5), job_id=job_id, attempt=1),
        progress(job_id, occurred_at=at(10), step=1),
        progress(job_id, occurred_at=at(1790), step=1000),
        JobRecovering(
            occurred_at=at(1800),
            job_id=job_id,
            attempt=1,
            cause=FailureCause.NODE_LOST,
            message="n1 lost",
            retry_at=at(1800),
            retries_used=1,
            retries_left=2,
        ),
        placed(job_id, at(1860), attempt=2, model="V100"),
        JobRunning(occurred_at=at(1865), job_id=job_id, attempt=2),
        progress(job_id, occurred_at=at(1870), step=900, attempt=2),
        progress(job_id, occurred_at=at(1970), step=1100, attempt=2),
        JobSucceeded(occurred_at=at(3660), job_id=job_id, attempt=2, final_loss=0.5, checkpoint_dir="/data/out"),
    ]


def cancelled(job_id: str, t0: datetime) -> list[Event]:
    """Cancelled after 30 s, never placed."""
    return [
        *accepted(job_id, t0),
        JobCancelled(occurred_at=t0 + timedelta(seconds=30), job_id=job_id, message="by cli"),
    ]


STORIES: dict[str, Callable[[str, datetime], list[Event]]] = {
    "succeeded": succeeded,
    "failed": failed,
    "retried": retried,
    "cancelled": cancelled,
}


def ledger(**seconds: float) -> dict[str, Any]:
    """A record's ledger columns: each part's seconds (those not given: 0), and the ETTR they give."""
    parts = {f"{part}_s": float(seconds.get(part, 0)) for part in LEDGER_PARTS}
    return {**parts, "ettr": round(parts["productive_s"] / sum(parts.values()), 6)}


LEDGER_PARTS = ("queued", "productive", "recovery", "recomputed", "notice", "degraded", "straggler")


def expected(story: str, job_id: str, t0: datetime) -> JobRecord:
    """The record each story gives."""
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    common: dict[str, Any] = {"job_id": job_id, "submitted_at": t0, "gpus": 2, "queue": "default"}
    return {
        "succeeded": lambda: JobRecord(
            **common,
            state=JobState.SUCCEEDED,
            gpu_model="A100",
            attempts=1,
            gpu_hours=2.0,
            revision=5,
            started_at=at(10),
            ended_at=at(3610),
            wait_s=10.0,
            run_s=3600.0,
            final_loss=1.25,
            # No shard reported a step: productive from every shard started (12 s).
            **ledger(queued=10, recovery=2, productive=3598),
        ),
        "failed": lambda: JobRecord(
            **common,
            state=JobState.FAILED,
            gpu_model="A100",
            attempts=1,
            gpu_hours=1.0,
            revision=5,
            reason="USER_ERROR",
            message="exit 1",
            started_at=at(0),
            ended_at=at(1800),
            wait_s=0.0,
            run_s=1800.0,
            **ledger(recovery=1, productive=1799),
        ),
        "retried": lambda: JobRecord(
            **common,
            state=JobState.SUCCEEDED,
            gpu_model="A100+V100",
            attempts=2,
            gpu_hours=2.0,
            revision=8,
            started_at=at(0),
            ended_at=at(3660),
            wait_s=0.0,
            run_s=3600.0,
            final_loss=0.5,
            # Attempt 1: recovery 0-10, productive 10-1790, recovery from its last step 1790-1800; the wait 1800-1860
            # after the fault is recovery; attempt 2: recovery 1860-1870, recomputed 1870-1920, productive 1920-3660.
            **ledger(recovery=10 + 10 + 60 + 10, productive=1780 + 1740, recomputed=50),
        ),
        "cancelled": lambda: JobRecord(
            **common,
            state=JobState.CANCELLED,
            gpu_model="A100",
            attempts=0,
            gpu_hours=0.0,
            revision=3,
            message="by cli",
            ended_at=at(30),
            wait_s=30.0,
            **ledger(queued=30),
        ),
    }[story]()
