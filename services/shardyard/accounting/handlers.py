"""Accounting handlers: each lifecycle fact, and each shard's step and failure, to the book; after each fetch, the
records it changed to the database.

The database is written once per batch of facts, in one transaction, not once per fact. A write that fails (the
database is down or locked past its timeout) leaves its records to be written again, as they are by then, with the
next batch or the next retry tick: nothing the log said is lost while the service runs, and a restart rebuilds
every record anyway.
"""

import asyncio
import logging
from datetime import datetime

from shardyard.accounting.book import AccountingBook, stranded
from shardyard.bus.topics import SHARD_EVENTS, Topic
from shardyard.errors import AccountingError
from shardyard.jobdb.query import MAX_LIMIT, HistoryQuery
from shardyard.jobdb.record import JobRecord
from shardyard.jobdb.store import Store
from shardyard.jobdb.urls import redacted
from shardyard.lifecycle import TERMINAL, JobState

log = logging.getLogger(__name__)
UNENDED = tuple(state for state in JobState if state not in TERMINAL)


class AccountingHandlers:
    def __init__(self, book: AccountingBook, store: Store, *, url: str) -> None:
        self.book = book
        self.store = store
        self.where = redacted(url)
        self.written = 0
        """Rows written since start (a row rewritten counts again)."""
        self.failing = False

    async def on_followed(self, topic: Topic, event: object) -> None:
        """The follower's two topics, each to its own fold: shard events to the goodput ledgers, facts to the
        records."""
        if topic is SHARD_EVENTS:
            self.book.on_shard(event)  # type: ignore[arg-type]  # the topic's events, decoded by its payload
        else:
            self.book.apply(event)  # type: ignore[arg-type]  # the lifecycle topic's

    async def flush(self) -> None:
        """Write the records that changed since the last write."""
        records = self.book.take_changed()
        if not records:
            return
        try:
            await asyncio.to_thread(self.store.upsert, records)
        except AccountingError as exc:
            self.book.changed_again(records)
            if not self.failing:  # said once per outage, not once per retry
                log.warning("accounting: %s; %d records wait to be written", exc, self.book.pending)
            self.failing = True
            return
        if self.failing:
            log.info("accounting: writing to %s again", self.where)
        self.failing = False
        self.written += len(records)

    async def reconcile(self, before: datetime, now: datetime) -> list[JobRecord]:
        """End the unended rows of jobs the log no longer holds (``book.stranded``), once the log was read whole; the
        rows ended."""
        kept: list[JobRecord] = []
        for state in UNENDED:
            query = HistoryQuery(state=state, limit=MAX_LIMIT)
            kept.extend(await asyncio.to_thread(self.store.select, query))
        ended = stranded(kept, self.book, before, now)
        if ended:
            await asyncio.to_thread(self.store.upsert, ended)
            for record in ended:
                log.warning(
                    "accounting: %s (accepted %s) ended: %s", record.job_id, record.submitted_at, record.message
                )
        return ended

    def close(self) -> None:
        self.store.close()
