"""The accounting table's SQL, one text for both back ends: they differ only in column types and in how a statement
marks its parameters (``?`` for sqlite3, ``%s`` for psycopg)."""

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Final

from shardyard.jobdb.query import HistoryQuery
from shardyard.jobdb.record import COLUMNS, KEY, LEDGER_COLUMNS

TABLE: Final = "job_accounting"

TYPES: Final = {
    # column: (SQLite, PostgreSQL). SQLite keeps times as ISO 8601 text in UTC with microseconds, which sorts as
    # the times do; PostgreSQL as timestamptz.
    "job_id": ("TEXT NOT NULL", "TEXT NOT NULL"),
    "submitted_at": ("TEXT NOT NULL", "TIMESTAMPTZ NOT NULL"),
    "state": ("TEXT NOT NULL", "TEXT NOT NULL"),
    "gpus": ("INTEGER NOT NULL", "INTEGER NOT NULL"),
    "gpu_model": ("TEXT", "TEXT"),
    "attempts": ("INTEGER NOT NULL", "INTEGER NOT NULL"),
    "gpu_hours": ("REAL NOT NULL", "DOUBLE PRECISION NOT NULL"),
    "revision": ("INTEGER NOT NULL", "BIGINT NOT NULL"),
    "team": ("TEXT", "TEXT"),
    "queue": ("TEXT", "TEXT"),
    "reason": ("TEXT", "TEXT"),
    "message": ("TEXT NOT NULL", "TEXT NOT NULL"),
    "started_at": ("TEXT", "TIMESTAMPTZ"),
    "ended_at": ("TEXT", "TIMESTAMPTZ"),
    "wait_s": ("REAL", "DOUBLE PRECISION"),
    "run_s": ("REAL", "DOUBLE PRECISION"),
    "final_loss": ("REAL", "DOUBLE PRECISION"),
    "owner": ("TEXT", "TEXT"),
    "key_id": ("TEXT", "TEXT"),
    **dict.fromkeys(LEDGER_COLUMNS, ("REAL", "DOUBLE PRECISION")),
}
ADDED_LATER: Final = ("owner", "key_id", *LEDGER_COLUMNS)
"""Columns a table made by an earlier version lacks: added where missing (``added``), empty for its old rows."""

SQLITE, POSTGRES = 0, 1


def create(dialect: int) -> list[str]:
    """The table and its indexes, each created only if missing: opening the database twice changes nothing."""
    columns = ",\n  ".join(f"{name} {types[dialect]}" for name, types in TYPES.items())
    return [
        f"CREATE TABLE IF NOT EXISTS {TABLE} (\n  {columns},\n  PRIMARY KEY ({', '.join(KEY)})\n)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_submitted ON {TABLE} (submitted_at)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_ended ON {TABLE} (ended_at)",
    ]


def added(existing: set[str], dialect: int) -> list[str]:
    """The statements that add to a table with ``existing`` columns the ones it lacks."""
    return [
        f"ALTER TABLE {TABLE} ADD COLUMN {name} {TYPES[name][dialect]}" for name in ADDED_LATER if name not in existing
    ]


def upsert(mark: str) -> str:
    """Insert a row, or replace the row of its key, unless that row has a higher revision (a replica that is behind
    does not take it back). Replacing a row by an equal one (the same events read again) leaves it as it was."""
    names = ", ".join(COLUMNS)
    marks = ", ".join([mark] * len(COLUMNS))
    updates = ", ".join(f"{name} = excluded.{name}" for name in COLUMNS if name not in KEY)
    return (
        f"INSERT INTO {TABLE} ({names}) VALUES ({marks}) ON CONFLICT ({', '.join(KEY)}) DO UPDATE SET {updates} "
        f"WHERE excluded.revision >= {TABLE}.revision"
    )


def select(query: HistoryQuery, mark: str, encode_time: Callable[[datetime], object]) -> tuple[str, list[object]]:
    """The rows ``query`` asks for, newest submission first, and the statement's parameters."""
    where: list[str] = []
    params: list[object] = []
    if query.job_id is not None:
        where.append(f"job_id = {mark}")
        params.append(query.job_id)
    if query.state is not None:
        where.append(f"state = {mark}")
        params.append(query.state.value)
    if query.since is not None:
        where.append(f"(ended_at IS NULL OR ended_at >= {mark})")
        params.append(encode_time(query.since))
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    sql = f"SELECT {', '.join(COLUMNS)} FROM {TABLE}{clause} ORDER BY submitted_at DESC, job_id LIMIT {mark}"
    return sql, [*params, query.limit]


def row_values(values: Mapping[str, object]) -> list[object]:
    return [values[name] for name in COLUMNS]
