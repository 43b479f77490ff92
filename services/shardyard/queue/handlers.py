"""Queue handlers: decode, call the book, publish. No decisions here."""

import logging

from faststream.kafka import KafkaMessage

from shardyard import tracing
from shardyard.bus.kafka import Bus, source_of, source_record
from shardyard.clock import Clock
from shardyard.events import JobAccepted
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
        events = self.book.on_submission(raw, source=source, now=self.clock.now())
        job_id = tracing.job_of(events[0]) if events else None  # no events: a redelivery, admitted before
        if job_id is None:
            return
        # The admission span continues the submitter's trace (its ``traceparent`` header), or starts the job's trace
        # (a plain-JSON submission, from kcat say). Only an acceptance (re)starts the job's trace everywhere.
        with tracing.job_span(
            "admission",
            job_id,
            parent=tracing.extract(tracing.from_headers(source_record(message).headers)),
            restart=isinstance(events[0], JobAccepted),
            attributes={**tracing.event_attributes(events[0]), "shardyard.outcome": type(events[0]).__name__},
        ):
            await self.bus.publish_all(events)

    async def on_lifecycle(self, event: LifecycleFact) -> None:
        await self.bus.publish_all(self.book.on_lifecycle(event, self.clock.now()))

    async def reconcile(self) -> None:
        """Once, after the start-up replay: carry out what the log says is due but was never published."""
        events = self.book.reconcile(self.clock.now())
        if events:
            log.info("reconciled after the replay: %s", ", ".join(f"{type(e).__name__} {e.job_id}" for e in events))
        await self.bus.publish_all(events)
