"""One job's accounting record: the row the accounting service writes and ``shardyard history`` reads.

A row is keyed by the job id and its acceptance time (``submitted_at``): within one log a job id is one job (the
queue refuses a duplicate), but an embedded broker forgets its log at ``shardyard down``, and a job id submitted again
to the next cluster is another job, not a new version of the first.
"""

from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any, Final

from shardyard.job_state import JobState


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    submitted_at: datetime
    """When the queue accepted the job (its spec's ``submitted_at``)."""
    state: JobState
    """The job's state now: its result once it ended (SUCCEEDED, FAILED, CANCELLED)."""
    gpus: int
    """The GPUs the job asked for (one per shard)."""
    gpu_model: str | None
    """The model its attempts ran on (several joined with ``+``: a degraded placement may mix them); before it ran,
    the model it asked for (None: any)."""
    attempts: int
    """How many times it was placed (a recovery or a preemption places it again)."""
    gpu_hours: float
    """The sum over its attempts that ended of their training GPUs times the time they held them (from
    ``job.scheduled`` to the event that ended the attempt), in hours; spares are not counted."""
    revision: int
    """How many lifecycle events changed this record: a writer replaces a row only with one of at least its
    revision, so a replica that is behind cannot take a row back to an older state."""
    team: str | None = None
    queue: str | None = None
    reason: str | None = None
    """Why it ended, typed: the ``FailureCause`` of a FAILED job; None for SUCCEEDED and CANCELLED."""
    message: str = ""
    started_at: datetime | None = None
    """When it was first placed (its first ``job.scheduled``: GPUs allocated, as Slurm's Start)."""
    ended_at: datetime | None = None
    wait_s: float | None = None
    """Submission to first placement; for a job that ended without running, submission to its end."""
    run_s: float | None = None
    """The time its attempts held GPUs, summed (gaps between attempts, spent waiting again, are not counted)."""
    final_loss: float | None = None
    """The one final loss of a SUCCEEDED job: rank 0's ``final_loss`` in the attempt that succeeded, as the
    scheduler puts it on ``job.succeeded`` (``shardyard.scheduler.completion``). Other ranks end with other losses
    (each trains on its own batches) and earlier attempts with earlier ones; none of those is the job's. A
    non-finite loss (a diverged run) is None: neither JSON nor SQLite has NaN."""
    owner: str | None = None
    """Who submitted it: the spec's ``owner`` (``shardyard submit`` fills in the local user)."""
    key_id: str | None = None
    """The team key its submission was signed with; None: unsigned."""
    ettr: float | None = None
    """Its goodput ledger (``shardyard.goodput``): the effective-training-time ratio, productive time over the whole
    (0 to 1), and below the seconds of each part, which add up to its time from submission to end. All None until
    the job ended (a running job's ledger grows by the second: the monitor shows it live)."""
    queued_s: float | None = None
    productive_s: float | None = None
    recovery_s: float | None = None
    recomputed_s: float | None = None
    notice_s: float | None = None
    degraded_s: float | None = None
    straggler_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as JSON values: times as ISO 8601 in UTC, the state as its name."""
        out = asdict(self)
        for name, value in out.items():
            if isinstance(value, datetime):
                out[name] = value.isoformat()
        out["state"] = self.state.value
        return out


COLUMNS: Final = tuple(f.name for f in fields(JobRecord))
"""Every column, in the order of the table, the JSON and the CSV."""
TIME_COLUMNS: Final = frozenset({"submitted_at", "started_at", "ended_at"})
KEY: Final = ("job_id", "submitted_at")
LEDGER_COLUMNS: Final = (
    "ettr",
    "queued_s",
    "productive_s",
    "recovery_s",
    "recomputed_s",
    "notice_s",
    "degraded_s",
    "straggler_s",
)
"""The goodput ledger's columns: named as the ledger's JSON names them (``shardyard.goodput.Ledger.to_json``)."""


def from_columns(values: dict[str, Any]) -> JobRecord:
    """A record from a row's values by column name (times already datetimes)."""
    return JobRecord(**{**values, "state": JobState(values["state"])})
