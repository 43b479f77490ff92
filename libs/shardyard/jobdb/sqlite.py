"""The accounting database in a SQLite file: the default, ``RUN_DIR/accounting.db`` for a local cluster.

Writers put the file in WAL mode, so readers (``shardyard history``, the monitor) read while a writer writes, and two
writers (the accounting service's replicas) wait their turn for up to ``BUSY_TIMEOUT_S``. A reader opens the file
read-only and never creates it. One connection per store, shared by the threads that use it under a lock.

Two writers that open a new file at the same moment (``up`` starts two accounting replicas together) set it up one
after the other, under an advisory lock on ``PATH.lock``: switching to WAL takes the file whole and does not wait
for SQLite's busy timeout, so the second one failed ``database is locked`` (about 1 ``up`` in 12, and 2 of 120
simultaneous opens here).
"""

import contextlib
import fcntl
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from shardyard.errors import AccountingError
from shardyard.jobdb import sql
from shardyard.jobdb.query import HistoryQuery
from shardyard.jobdb.record import COLUMNS, TIME_COLUMNS, JobRecord, from_columns

BUSY_TIMEOUT_S: Final = 10.0


def encode_time(at: datetime) -> str:
    """UTC, always with microseconds: the text sorts as the times do."""
    return at.astimezone(UTC).isoformat(timespec="microseconds")


@contextlib.contextmanager
def _setting_up(path: Path) -> Iterator[None]:
    """One writer at a time sets the file up (see the module's doc)."""
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class SqliteStore:
    def __init__(self, path: Path, *, create: bool) -> None:
        self.path = path
        if not create and not path.is_file():
            raise AccountingError(f"no accounting database at {path} (the accounting service writes it)")
        mode = "rwc" if create else "ro"
        try:
            if create:
                path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                f"file:{path}?mode={mode}",
                uri=True,
                timeout=BUSY_TIMEOUT_S,
                check_same_thread=False,
                isolation_level=None,  # autocommit; upsert opens its own transaction
            )
            if create:
                with _setting_up(path):
                    self._db.execute("PRAGMA journal_mode=WAL")
                    for statement in sql.create(sql.SQLITE):
                        self._db.execute(statement)
                    existing = {row[1] for row in self._db.execute(f"PRAGMA table_info({sql.TABLE})")}
                    for statement in sql.added(existing, sql.SQLITE):
                        self._db.execute(statement)
        except (sqlite3.Error, OSError) as exc:
            raise AccountingError(f"cannot open the accounting database {path}: {exc}") from exc
        self._lock = threading.Lock()

    def upsert(self, records: Sequence[JobRecord]) -> None:
        rows = [sql.row_values(_encoded(record)) for record in records]
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.executemany(sql.upsert("?"), rows)
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise AccountingError(f"cannot write the accounting database {self.path}: {exc}") from exc

    def select(self, query: HistoryQuery) -> list[JobRecord]:
        statement, params = sql.select(query, "?", encode_time)
        with self._lock:
            try:
                rows = self._db.execute(statement, params).fetchall()
            except sqlite3.Error as exc:
                raise AccountingError(f"cannot read the accounting database {self.path}: {exc}") from exc
        return [_decoded(row) for row in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _encoded(record: JobRecord) -> dict[str, object]:
    values: dict[str, object] = asdict(record)
    for name in TIME_COLUMNS:
        at = values[name]
        values[name] = encode_time(at) if isinstance(at, datetime) else None
    values["state"] = record.state.value
    return values


def _decoded(row: Sequence[object]) -> JobRecord:
    values = dict(zip(COLUMNS, row, strict=True))
    for name in TIME_COLUMNS:
        text = values[name]
        values[name] = datetime.fromisoformat(text) if isinstance(text, str) else None
    return from_columns(values)
