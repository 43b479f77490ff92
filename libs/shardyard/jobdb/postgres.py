"""The accounting database in PostgreSQL (``--accounting-url postgresql://USER:PASSWORD@HOST:PORT/DATABASE``),
through psycopg 3, imported only when such a URL is given.

One connection per store, in autocommit; an upsert is one transaction, its rows sent in one pipeline (psycopg's
``executemany``). A connection the server dropped is opened again on the next call, so the accounting service
outlives a database restart: what it could not write stays to be written (see its handlers).
"""

import threading
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, Final

import psycopg
from psycopg import errors as pg_errors

from shardyard.errors import AccountingError
from shardyard.jobdb import sql
from shardyard.jobdb.query import HistoryQuery
from shardyard.jobdb.record import COLUMNS, TIME_COLUMNS, JobRecord, from_columns
from shardyard.jobdb.urls import redacted

CONNECT_TIMEOUT_S: Final = 10


class PostgresStore:
    def __init__(self, url: str, *, create: bool) -> None:
        self.url, self.create = url, create
        self._lock = threading.Lock()
        self._db: psycopg.Connection[Any] | None = None
        with self._lock:
            self._connection()

    def _connection(self) -> "psycopg.Connection[Any]":
        """The open connection, opened again if the server closed it; the table created first by a writer."""
        if self._db is not None and not self._db.closed and not self._db.broken:
            return self._db
        try:
            db = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
            if self.create:
                for statement in sql.create(sql.POSTGRES):
                    db.execute(statement)
                found = db.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = %s", (sql.TABLE,)
                ).fetchall()
                for statement in sql.added({str(row[0]) for row in found}, sql.POSTGRES):
                    db.execute(statement)
        except psycopg.Error as exc:
            raise AccountingError(f"cannot open the accounting database {redacted(self.url)}: {exc}") from exc
        self._db = db
        return db

    def upsert(self, records: Sequence[JobRecord]) -> None:
        rows = [sql.row_values(_encoded(record)) for record in records]
        with self._lock:
            db = self._connection()
            try:
                with db.transaction(), db.cursor() as cursor:
                    cursor.executemany(sql.upsert("%s"), rows)
            except psycopg.Error as exc:
                raise AccountingError(f"cannot write the accounting database {redacted(self.url)}: {exc}") from exc

    def select(self, query: HistoryQuery) -> list[JobRecord]:
        statement, params = sql.select(query, "%s", lambda at: at)
        with self._lock:
            db = self._connection()
            try:
                rows = db.execute(statement, params).fetchall()
            except pg_errors.UndefinedTable as exc:
                raise AccountingError(
                    f"no accounting table in {redacted(self.url)} yet (the accounting service creates it)"
                ) from exc
            except psycopg.Error as exc:
                raise AccountingError(f"cannot read the accounting database {redacted(self.url)}: {exc}") from exc
        return [_decoded(row) for row in rows]

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()


def _encoded(record: JobRecord) -> dict[str, object]:
    values: dict[str, object] = asdict(record)
    values["state"] = record.state.value
    return values


def _decoded(row: Sequence[object]) -> JobRecord:
    values = dict(zip(COLUMNS, row, strict=True))
    for name in TIME_COLUMNS:
        at = values[name]
        values[name] = at.astimezone(UTC) if isinstance(at, datetime) else None
    return from_columns(values)
