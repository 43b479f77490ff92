"""``shardyard history``'s three outputs, pure functions of the records: a table for people, JSON (the same
document as the monitor's ``/api/history``) and CSV (a header of the column names, times in ISO 8601, empty for
none) for scripts and spreadsheets."""

import csv
import io
import json
from collections.abc import Sequence
from datetime import UTC, datetime

from shardyard.jobdb.record import COLUMNS, JobRecord
from shardyard.text_table import table

HEADERS = [
    "JOB",
    "STATE",
    "TEAM",
    "USER",
    "KEY",
    "QUEUE",
    "GPUS",
    "MODEL",
    "SUBMITTED (UTC)",
    "WAIT",
    "RUN",
    "GPU-H",
    "ATTEMPTS",
    "FINAL LOSS",
    "REASON",
]


def duration(seconds: float | None) -> str:
    """``45s``, ``12m05s``, ``3h07m``; ``-`` for none."""
    if seconds is None:
        return "-"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def as_table(records: Sequence[JobRecord]) -> str:
    if not records:
        return "no jobs in the accounting database match"
    rows = [
        [
            r.job_id,
            r.state.value,
            r.team or "-",
            r.owner or "-",
            r.key_id or "-",
            r.queue or "-",
            str(r.gpus),
            r.gpu_model or "any",
            _when(r.submitted_at),
            duration(r.wait_s),
            duration(r.run_s),
            f"{r.gpu_hours:.3f}",
            str(r.attempts),
            "-" if r.final_loss is None else f"{r.final_loss:.4f}",
            ": ".join(part for part in (r.reason, r.message) if part) or "-",
        ]
        for r in records
    ]
    return table(rows, HEADERS)


def as_json(records: Sequence[JobRecord]) -> str:
    return json.dumps({"jobs": [r.to_json() for r in records]}, indent=2)


def as_csv(records: Sequence[JobRecord]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for record in records:
        document = record.to_json()
        writer.writerow(["" if document[name] is None else document[name] for name in COLUMNS])
    return out.getvalue().rstrip("\n")


OUTPUTS = {"table": as_table, "json": as_json, "csv": as_csv}
