"""``/api/history``: jobs as the accounting database keeps them, with ``shardyard history``'s filters as query
parameters (``?since=1d&state=FAILED&job=ID&limit=100``) and its JSON (``{"jobs": [...]}``).

The monitor's view holds what the log holds; this answer holds what the database holds, which outlives the log (an
embedded broker's is gone after ``shardyard down``). The database is the monitor's ``--accounting-url`` (``shardyard
up`` passes the one its accounting service writes), opened read-only on the first request, and read in a worker
thread so a slow database never stalls the event loop that folds the topics. Without one the answer is 503, saying
so; a filter that cannot be used is 400, naming it.
"""

import asyncio
import threading

from aiohttp import web
from pydantic_core import to_json

from shardyard.clock import Clock
from shardyard.errors import AccountingError, ConfigError
from shardyard.jobdb.query import HistoryQuery, query_of
from shardyard.jobdb.record import JobRecord
from shardyard.jobdb.store import Store, open_store


class HistoryApi:
    def __init__(self, url: str | None, clock: Clock) -> None:
        self.url, self.clock = url, clock
        self._store: Store | None = None
        self._lock = threading.Lock()

    async def serve(self, request: web.Request) -> web.Response:
        if self.url is None:
            return _answer({"error": "this monitor has no accounting database (start it with --accounting-url)"}, 503)
        try:
            query = query_of(dict(request.query), self.clock.now())
        except ConfigError as exc:
            return _answer({"error": str(exc)}, 400)
        try:
            records = await asyncio.to_thread(self._select, query)
        except AccountingError as exc:
            return _answer({"error": str(exc)}, 503)
        return _answer({"jobs": [record.to_json() for record in records]})

    def _select(self, query: HistoryQuery) -> list[JobRecord]:
        """Rows from the database, opened on first use and again after a failure (it may not exist yet when the
        monitor starts beside the accounting service)."""
        assert self.url is not None
        with self._lock:
            if self._store is None:
                self._store = open_store(self.url, create=False)
            try:
                return self._store.select(query)
            except AccountingError:
                self._store.close()
                self._store = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


def _answer(document: object, status: int = 200) -> web.Response:
    return web.Response(body=to_json(document, inf_nan_mode="null"), status=status, content_type="application/json")
