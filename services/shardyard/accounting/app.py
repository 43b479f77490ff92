"""Wiring of the accounting service: the lifecycle topic and the shards' steps and failures (for the goodput ledger),
followed from their beginning, into the accounting database.

No consumer group: every replica (``shardyard up`` starts two) reads both topics whole, from offset 0, on every start
and so rebuilds every record the log still holds, by upserts that leave a row as it was when its facts are read again.
Two replicas write the same rows; the revision guard of the upsert (``shardyard.jobdb.sql``) keeps one that is behind
from taking a row back. Rows of unended jobs the log no longer holds (an embedded broker forgets its log when it
stops, a cluster started afresh) are ended ``BROKER_LOG_LOST`` once the log was read whole (``book.stranded``).
"""

import logging
from datetime import timedelta

from faststream import FastStream
from pydantic import Field

from shardyard.accounting.book import AccountingBook
from shardyard.accounting.handlers import AccountingHandlers
from shardyard.bus.admin import ensure_topics
from shardyard.bus.follow import Follower
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.topics import LIFECYCLE, SHARD_EVENTS
from shardyard.clock import Clock
from shardyard.jobdb.store import open_store
from shardyard.jobdb.urls import DATABASE_FILE, redacted
from shardyard.service import Periodic, announce
from shardyard.settings import ServiceSettings

SERVICE = "accounting"
RECONCILE_MARGIN_S = 30.0
"""Rows of jobs accepted this long before the log was read whole are judged (clocks and the other replica allowed)."""
UNREAD = frozenset({"shard.started", "shard.checkpointed", "shard.completed", "shard.preempted", "job.unschedulable"})
"""What no record or ledger needs, passed over unread (``Follower.unread``): of the shard topic only the steps and the
failures are read (a step costs a decode and an O(1) fold, and no write while its job runs)."""
log = logging.getLogger(__name__)


class AccountingSettings(ServiceSettings):
    """The accounting service: every job's record (times, GPUs, GPU-hours, attempts, result, final loss), folded
    from the lifecycle topic into SQLite or PostgreSQL."""

    accounting_url: str = Field(
        default=f"sqlite:{DATABASE_FILE}",
        min_length=1,
        description="the accounting database: sqlite:///PATH (a file, created if missing) or "
        "postgresql://USER:PASSWORD@HOST:PORT/DATABASE",
    )
    retry_interval_s: float = Field(
        default=1.0, gt=0, le=60, description="how often records that could not be written are tried again (s)"
    )


def build_app(settings: AccountingSettings, *, clock: Clock) -> FastStream:
    """The database is opened here, so a URL that cannot be used fails the process at once, saying why."""
    bus = Bus(make_broker(settings.bootstrap, client_id=f"{SERVICE}-{settings.instance}"), service=SERVICE)
    book = AccountingBook()
    handlers = AccountingHandlers(book, open_store(settings.accounting_url, create=True), url=settings.accounting_url)
    follower = Follower(
        settings.bootstrap,
        [LIFECYCLE, SHARD_EVENTS],
        handlers.on_followed,
        name=f"{SERVICE}-{settings.instance}-follow",
        after_batch=handlers.flush,
        unread=UNREAD,
    )
    retry = Periodic("accounting-retry", settings.retry_interval_s, handlers.flush)
    app = FastStream(bus.broker)

    @app.on_startup
    async def rebuild() -> None:
        await ensure_topics(settings.bootstrap)
        await follower.start()
        began = clock.now() - timedelta(seconds=RECONCILE_MARGIN_S)
        await follower.caught_up()
        await handlers.flush()
        await handlers.reconcile(began, clock.now())
        log.info("accounting: %d jobs rebuilt from the log into %s", len(book.jobs), redacted(settings.accounting_url))

    @app.after_startup
    async def ready() -> None:
        retry.start()
        await announce(bus, clock, instance=settings.instance)

    @app.on_shutdown
    async def stop() -> None:
        await retry.stop()
        await follower.stop()
        await handlers.flush()
        handlers.close()

    return app
