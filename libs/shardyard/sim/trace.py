"""The simulator's trace: one CSV row per job, parsed strictly.

Columns (a header row names them, in any order):

=============  ========  ================================================================================
``submit_s``   required  seconds from the start of the trace, >= 0
``gpus``       required  GPUs of the gang (one shard each), integer 1..64
``gpu_model``  required  a catalogue model (A100, V100, H100, ...), or ``ANY`` / empty for any GPU
``duration_s`` required  run time on full-match GPUs, > 0
``priority``   required  integer 0..1000
``job_id``     optional  unique; default ``job-<row>`` (data rows counted from 1)
``min_tflops`` optional  the TFLOPS floor; default the catalogue figure of ``gpu_model`` (0 for ANY)
``min_match``  optional  opt-in degraded placement floor in (0, 1]; empty: full match only
``max_wait_s`` optional  seconds to wait for a full match before ``min_match`` applies (needs ``min_match``)
``user``       optional  who submitted it (duration estimates are learned per user, then per queue)
``queue``      optional  the queue it was submitted to
``expected_duration_s``  optional  the run time the job declares (> 0); empty: estimated from history
``checkpoint_every_s``   optional  seconds of progress between its periodic checkpoints (> 0); empty: the
                                   simulation's (``--checkpoint-every-s``)
``min_shards``, ``max_shards``  optional  an elastic job's range of sizes, both or neither: 1 <= ``min_shards`` <=
                                   ``gpus`` (its preferred size) <= ``max_shards``; empty: rigid (``sim.gang``)
=============  ========  ================================================================================

``gpus`` must be a whole number: a fractional GPU (0.5, as some traces record shared GPUs) is refused naming the
line, unless the trace is read with ``round_gpus`` (``shardyard simulate --round-gpus``), which rounds it up to
whole GPUs (a job never gets less than it asked for).

Every problem is a ``TraceError`` naming the line (the header is line 1) and the column.
"""

import csv
import io
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from shardyard.errors import ShardyardError
from shardyard.gpus import DEFAULT_TFLOPS, canonical_model

REQUIRED = ("submit_s", "gpus", "gpu_model", "duration_s", "priority")
OPTIONAL = (
    "job_id",
    "min_tflops",
    "min_match",
    "max_wait_s",
    "user",
    "queue",
    "expected_duration_s",
    "checkpoint_every_s",
    "min_shards",
    "max_shards",
)
COLUMNS = ("job_id", *REQUIRED, *OPTIONAL[1:])
"""The order ``write_trace`` uses."""
ANY = "ANY"
MAX_GPUS = 64
MAX_PRIORITY = 1000
MAX_SHARDS = 4096
"""The most shards an elastic job may grow to (as a submission's ``elasticity``)."""


class TraceError(ShardyardError):
    """A trace that cannot be simulated: ``line`` (1 = the header) and ``column`` say where, when known."""

    def __init__(self, source: str, line: int, column: str | None, problem: str) -> None:
        where = f"{source}:{line}" + (f": column {column!r}" if column else "")
        super().__init__(f"{where}: {problem}")
        self.source = source
        self.line = line
        self.column = column
        self.problem = problem


@dataclass(frozen=True)
class TraceJob:
    job_id: str
    submit_s: float
    gpus: int
    gpu_model: str | None
    """Canonical model name; None: any GPU."""
    duration_s: float
    priority: int
    min_tflops: float
    min_match: float | None = None
    max_wait_s: float = 0.0
    user: str = ""
    queue: str = ""
    expected_duration_s: float | None = None
    """Declared by the job; None: the policy estimates it (the simulator never tells it ``duration_s``)."""
    checkpoint_every_s: float | None = None
    """Seconds of progress between its periodic checkpoints; None: the simulation's (``WorkModel``)."""
    min_shards: int | None = None
    """An elastic job's fewest GPUs (one shard each); None: rigid (then ``max_shards`` is None too)."""
    max_shards: int | None = None
    """An elastic job's most GPUs; ``min_shards <= gpus <= max_shards``."""


class _Row:
    """One data row being parsed: every field read goes through ``take`` so errors carry line and column."""

    def __init__(self, source: str, line: int, values: Mapping[str, str], *, round_gpus: bool = False) -> None:
        self.source = source
        self.line = line
        self.values = values
        self.round_gpus = round_gpus

    def fail(self, column: str | None, problem: str) -> TraceError:
        return TraceError(self.source, self.line, column, problem)

    def text(self, column: str) -> str:
        return self.values.get(column, "").strip()

    def number(self, column: str, *, low: float, high: float = math.inf, open_low: bool = False) -> float:
        raw = self.text(column)
        if not raw:
            raise self.fail(column, "is empty; a number is required")
        try:
            value = float(raw)
        except ValueError:
            raise self.fail(column, f"{raw!r} is not a number") from None
        bound = "above" if open_low else "at least"
        if not math.isfinite(value) or value < low or (open_low and value == low) or value > high:
            upper = f" and at most {high:g}" if math.isfinite(high) else ""
            raise self.fail(column, f"{raw!r} is out of range; must be {bound} {low:g}{upper}")
        return value

    def integer(self, column: str, *, low: int, high: int) -> int:
        raw = self.text(column)
        if not raw:
            raise self.fail(column, "is empty; an integer is required")
        try:
            value = int(raw)
        except ValueError:
            raise self.fail(column, f"{raw!r} is not an integer") from None
        if not low <= value <= high:
            raise self.fail(column, f"{raw!r} is out of range; must be {low}..{high}")
        return value


def _header(source: str, header: list[str]) -> list[str]:
    names = [name.strip() for name in header]
    known = set(REQUIRED) | set(OPTIONAL)
    for name in names:
        if name not in known:
            raise TraceError(source, 1, name, f"unknown column; the columns are {', '.join((*REQUIRED, *OPTIONAL))}")
        if names.count(name) > 1:
            raise TraceError(source, 1, name, "appears twice")
    missing = [name for name in REQUIRED if name not in names]
    if missing:
        raise TraceError(source, 1, missing[0], "required column missing from the header")
    return names


def _job(row: _Row, number: int, catalogue: Mapping[str, float]) -> TraceJob:
    submit_s = row.number("submit_s", low=0.0)
    gpus = _gpus(row)
    model_text = row.text("gpu_model")
    model = None if model_text.upper() in ("", ANY) else canonical_model(model_text)
    if model is not None and model not in catalogue:
        known = ", ".join(sorted(catalogue))
        raise row.fail("gpu_model", f"unknown GPU model {model_text!r}; use one of {known} or ANY")
    duration_s = row.number("duration_s", low=0.0, open_low=True)
    priority = row.integer("priority", low=0, high=MAX_PRIORITY)
    job_id = row.text("job_id") or f"job-{number}"
    default_tflops = catalogue[model] if model is not None else 0.0
    min_tflops = row.number("min_tflops", low=0.0) if row.text("min_tflops") else default_tflops
    min_match = row.number("min_match", low=0.0, high=1.0, open_low=True) if row.text("min_match") else None
    max_wait_s = row.number("max_wait_s", low=0.0) if row.text("max_wait_s") else 0.0
    if min_match is None and row.text("max_wait_s"):
        raise row.fail("max_wait_s", "is set without min_match (it is the wait before min_match applies)")
    expected = row.number("expected_duration_s", low=0.0, open_low=True) if row.text("expected_duration_s") else None
    every = row.number("checkpoint_every_s", low=0.0, open_low=True) if row.text("checkpoint_every_s") else None
    min_shards, max_shards = _sizes(row, gpus)
    return TraceJob(
        job_id,
        submit_s,
        gpus,
        model,
        duration_s,
        priority,
        min_tflops,
        min_match,
        max_wait_s,
        user=row.text("user"),
        queue=row.text("queue"),
        expected_duration_s=expected,
        checkpoint_every_s=every,
        min_shards=min_shards,
        max_shards=max_shards,
    )


def _sizes(row: _Row, gpus: int) -> tuple[int | None, int | None]:
    """An elastic job's ``min_shards`` and ``max_shards`` (both None: rigid)."""
    given = [column for column in ("min_shards", "max_shards") if row.text(column)]
    if not given:
        return None, None
    if len(given) == 1:
        other = "max_shards" if given[0] == "min_shards" else "min_shards"
        raise row.fail(given[0], f"is set without {other} (an elastic job gives both; neither: rigid)")
    low = row.integer("min_shards", low=1, high=MAX_SHARDS)
    high = row.integer("max_shards", low=1, high=MAX_SHARDS)
    if not low <= gpus <= high:
        problem = f"min_shards ({low}) <= gpus ({gpus}, the preferred size) <= max_shards ({high}) does not hold"
        raise row.fail("min_shards" if low > gpus else "max_shards", problem)
    return low, high


def _gpus(row: _Row) -> int:
    """The gang's GPUs: a whole number, or (``round_gpus``) a fraction rounded up to one."""
    raw = row.text("gpus")
    try:
        value = float(raw) if raw else math.nan
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value != int(value):
        if not row.round_gpus:
            raise row.fail(
                "gpus",
                f"{raw!r} is a fractional GPU; the simulator places whole GPUs (read the trace with --round-gpus"
                " to round each up)",
            )
        if not 0 < value <= MAX_GPUS:
            raise row.fail("gpus", f"{raw!r} is out of range; must be 1..{MAX_GPUS}")
        return math.ceil(value)
    return row.integer("gpus", low=1, high=MAX_GPUS)


def parse_trace(
    stream: TextIO,
    source: str = "<trace>",
    catalogue: Mapping[str, float] = DEFAULT_TFLOPS,
    *,
    round_gpus: bool = False,
) -> list[TraceJob]:
    """The jobs of a CSV trace, in file order. Raises TraceError at the first problem."""
    reader = csv.reader(stream)
    try:
        header = next(reader, None)
        if header is None:
            raise TraceError(source, 1, None, "the trace is empty; it needs a header row and at least one job")
        names = _header(source, header)
        jobs: list[TraceJob] = []
        seen: dict[str, int] = {}
        for cells in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in cells):
                continue
            if len(cells) != len(names):
                raise TraceError(source, line, None, f"has {len(cells)} fields; the header has {len(names)}")
            row = _Row(source, line, dict(zip(names, cells, strict=True)), round_gpus=round_gpus)
            job = _job(row, len(jobs) + 1, catalogue)
            if job.job_id in seen:
                raise row.fail("job_id", f"{job.job_id!r} already used on line {seen[job.job_id]}")
            seen[job.job_id] = line
            jobs.append(job)
    except csv.Error as exc:
        raise TraceError(source, reader.line_num, None, f"not valid CSV: {exc}") from exc
    if not jobs:
        raise TraceError(source, reader.line_num or 1, None, "the trace has no jobs")
    return jobs


def read_trace(
    path: Path, catalogue: Mapping[str, float] = DEFAULT_TFLOPS, *, round_gpus: bool = False
) -> list[TraceJob]:
    try:
        with path.open(newline="", encoding="utf-8") as stream:
            return parse_trace(stream, str(path), catalogue, round_gpus=round_gpus)
    except OSError as exc:
        raise TraceError(str(path), 0, None, f"cannot read the trace: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise TraceError(str(path), 0, None, "not UTF-8 text") from exc


def _cell(value: float | None) -> str:
    return "" if value is None else repr(value)


def write_trace(jobs: Iterable[TraceJob], stream: TextIO) -> None:
    """Write ``jobs`` as CSV with every column, so the file reads back to the same jobs."""
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(COLUMNS)
    for job in jobs:
        writer.writerow(
            [
                job.job_id,
                repr(job.submit_s),
                job.gpus,
                job.gpu_model or ANY,
                repr(job.duration_s),
                job.priority,
                _cell(job.min_tflops),
                _cell(job.min_match),
                _cell(job.max_wait_s) if job.min_match is not None else "",
                job.user,
                job.queue,
                _cell(job.expected_duration_s),
                _cell(job.checkpoint_every_s),
                "" if job.min_shards is None else job.min_shards,
                "" if job.max_shards is None else job.max_shards,
            ]
        )


def trace_text(jobs: Iterable[TraceJob]) -> str:
    buffer = io.StringIO()
    write_trace(jobs, buffer)
    return buffer.getvalue()
