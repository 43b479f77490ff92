"""The accounting database behind one seam: ``open_store(url)`` gives the back end the URL names.

- ``sqlite:///ABSOLUTE/PATH``, ``sqlite:RELATIVE/PATH`` or a plain path: a SQLite file (``shardyard.jobdb.sqlite``);
- ``postgresql://USER:PASSWORD@HOST:PORT/DATABASE`` (or ``postgres://``): PostgreSQL through psycopg 3
  (``shardyard.jobdb.postgres``).

A writer (``create=True``: the accounting service) creates the table if it is missing; a reader (``shardyard
history``, the monitor) opens what is there and is told when there is nothing yet. Every failure of the database is
an ``AccountingError`` naming the database (its password left out).
"""

from collections.abc import Sequence
from typing import Protocol
from urllib.parse import urlsplit

from shardyard.errors import AccountingError
from shardyard.jobdb.query import HistoryQuery
from shardyard.jobdb.record import JobRecord
from shardyard.jobdb.urls import POSTGRES_SCHEMES, redacted, sqlite_path


class Store(Protocol):
    def upsert(self, records: Sequence[JobRecord]) -> None:
        """Write ``records`` in one transaction (see ``sql.upsert``)."""

    def select(self, query: HistoryQuery) -> list[JobRecord]: ...

    def close(self) -> None: ...


def open_store(url: str, *, create: bool) -> Store:
    """The back end ``url`` names, open. Raises AccountingError when it cannot be opened (or, for a reader, holds no
    accounting table yet), or the URL names no back end."""
    path = sqlite_path(url)
    if path is not None:
        from shardyard.jobdb.sqlite import SqliteStore

        return SqliteStore(path, create=create)
    if urlsplit(url).scheme in POSTGRES_SCHEMES:
        from shardyard.jobdb.postgres import PostgresStore

        return PostgresStore(url, create=create)
    raise AccountingError(f"an accounting URL is sqlite:///PATH or postgresql://..., not {redacted(url)!r}")
