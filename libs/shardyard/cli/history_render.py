"""``shardyard history``'s outputs, pure functions of the records: a table for people (``wide``: with the seconds of
each part of the goodput ledger), JSON (the same document as the monitor's ``/api/history``) and CSV (a header of the
column names, times in ISO 8601, empty for none) for scripts and spreadsheets."""

import csv
import io
import json
from collections.abc import Sequence
from datetime import UTC, datetime

from shardyard.jobdb.record import COLUMNS, LEDGER_COLUMNS, JobRecord
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
    "ETTR",
    "FINAL LOSS",
    "REASON",
]
PARTS = [name.removesuffix("_s") for name in LEDGER_COLUMNS if name != "ettr"]
"""The ledger's parts, as ``-o wide`` shows them (before REASON), in the columns' order."""


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


def ettr(value: float | None) -> str:
    """``96.2%``; ``-`` for none (a job that has not ended)."""
    return "-" if value is None else f"{value:.1%}"


def as_table(records: Sequence[JobRecord], *, wide: bool = False) -> str:
    if not records:
        return "no jobs in the accounting database match"
    rows = [_row(r, wide) for r in records]
    headers = [*HEADERS[:-1], *(part.upper() for part in PARTS), HEADERS[-1]] if wide else HEADERS
    return table(rows, headers)


def _row(r: JobRecord, wide: bool) -> list[str]:
    parts = [duration(getattr(r, f"{part}_s")) for part in PARTS] if wide else []
    return [
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
        ettr(r.ettr),
        "-" if r.final_loss is None else f"{r.final_loss:.4f}",
        *parts,
        ": ".join(part for part in (r.reason, r.message) if part) or "-",
    ]


def as_wide(records: Sequence[JobRecord]) -> str:
    return as_table(records, wide=True)


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


OUTPUTS = {"table": as_table, "wide": as_wide, "json": as_json, "csv": as_csv}
