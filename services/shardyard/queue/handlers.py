"""Queue handlers: decode, call the book, publish. No decisions here."""

from faststream.kafka import KafkaMessage

from shardyard.bus.kafka import Bus, source_of
from shardyard.clock import Clock
from shardyard.lifecycle import LifecycleFact
from shardyard.queue.book import QueueBook


class QueueHandlers:
    def __init__(self, book: QueueBook, bus: Bus, clock: Clock) -> None:
        self.book = book
        self.bus = bus
        self.clock = clock

    async def on_submission(self, raw: bytes, message: KafkaMessage) -> None:
        source = source_of(message)
        await self.bus.publish_all(self.book.on_submission(raw, source=source, now=self.clock.now()))

    async def on_lifecycle(self, event: LifecycleFact) -> None:
        self.book.apply(event)
