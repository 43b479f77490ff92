"""Queue handlers: decode, call the book, publish. No decisions here."""

import logging

from faststream.kafka import KafkaMessage

from shardyard.bus.kafka import Bus, source_of
from shardyard.clock import Clock
from shardyard.lifecycle import LifecycleFact
from shardyard.queue.book import QueueBook

log = logging.getLogger(__name__)


class QueueHandlers:
    def __init__(self, book: QueueBook, bus: Bus, clock: Clock) -> None:
        self.book = book
        self.bus = bus
        self.clock = clock

    async def on_submission(self, raw: bytes, message: KafkaMessage) -> None:
        source = source_of(message)
        await self.bus.publish_all(self.book.on_submission(raw, source=source, now=self.clock.now()))

    async def on_lifecycle(self, event: LifecycleFact) -> None:
        await self.bus.publish_all(self.book.on_lifecycle(event, self.clock.now()))

    async def reconcile(self) -> None:
        """Once, after the start-up replay: carry out what the log says is due but was never published."""
        events = self.book.reconcile(self.clock.now())
        if events:
            log.info("reconciled after the replay: %s", ", ".join(f"{type(e).__name__} {e.job_id}" for e in events))
        await self.bus.publish_all(events)
