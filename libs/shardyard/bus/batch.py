"""Consuming a busy topic a batch at a time: apply the batch, publish its results without awaiting each, commit once.

At 1 Hz per node, the heartbeats of 10,000 nodes are 10,000 messages a second. Handled one at a time, each message
costs a trip through the framework, a broker round trip for each event it causes and a commit: a replica then keeps
up with about a hundred a second, whatever its CPU. A batch costs those once:

1. **read**: one ``getmany`` of up to ``max_records`` records (FastStream's batch subscriber);
2. **decode**: each record into its topic's event; one that does not decode is dead-lettered, the rest go on;
3. **apply**: each topic's handler takes the batch's events of that topic, in log order, and returns the events they
   cause (a handler never publishes itself);
4. **publish**: every resulting event is handed to the producer, then every acknowledgement awaited at once;
5. **commit**: only then are the batch's offsets committed (FastStream's ``AckPolicy.ACK``, after the handler).

A replica killed anywhere before step 5 commits nothing of the batch: the group hands its partitions to another
replica, which reads the batch again. Handlers must therefore be idempotent, as every Shardyard handler is. A handler
that raises is retried on the same events; if it keeps failing, its events are tried one at a time and the ones that
still fail are dead-lettered, so one poison message costs its own place in the log and nothing else.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias

from aiokafka import ConsumerRecord

from shardyard import metrics, tracing
from shardyard.bus.codec import decode
from shardyard.bus.topics import Topic
from shardyard.errors import EventDecodeError
from shardyard.events import Event

log = logging.getLogger(__name__)

Record: TypeAlias = ConsumerRecord[bytes, bytes]
BatchHandler = Callable[[Sequence[Any]], Awaitable[Sequence[Event]]]
"""A topic's events of one batch, in log order -> the events they cause, to publish."""
RawBatchHandler = Callable[[Sequence["Record"]], Awaitable[Sequence[Awaitable[object]]]]
"""A topic's records of one batch (a topic of raw bytes), in log order -> the acknowledgements of what the handler
sent (``Bus.send`` and ``Bus.send_raw``), awaited before the batch is committed."""

MAX_RECORDS = 1000
"""Records one batch reads at most: at 10,000 heartbeats a second a replica catches up in batches of about this."""
BATCH_TIMEOUT_MS = 20
"""How long an idle batch subscriber waits between polls: the latency a lone message can pay on a quiet topic."""
HANDLER_ATTEMPTS = 3


class Sender(Protocol):
    service: str

    async def send(self, event: Event) -> "asyncio.Future[Any]": ...

    async def send_dead_letter(self, raw: bytes, record: Record, error: str) -> "asyncio.Future[Any]": ...


def source_of(record: Record) -> str:
    return f"{record.topic}/{record.partition}/{record.offset}"


class BatchConsumer:
    """Steps 2-4 of a batch, for one subscription: ``await consumer.handle(records)`` returns once every event the
    batch caused, and every dead letter, is acknowledged by the broker; the caller commits after it."""

    def __init__(
        self,
        bus: Sender,
        routes: Mapping[Topic, BatchHandler],
        raw_routes: Mapping[Topic, RawBatchHandler] | None = None,
    ) -> None:
        self.bus = bus
        self.routes = dict(routes)
        self.raw_routes = dict(raw_routes or {})
        self.by_name = {topic.name: topic for topic in [*self.routes, *self.raw_routes]}

    async def handle(self, records: Sequence[Record]) -> None:
        began = time.perf_counter()
        pending: list[Awaitable[object]] = []
        by_topic: dict[Topic, list[tuple[Any, Record]]] = {}
        raw_by_topic: dict[Topic, list[Record]] = {}
        for record in records:
            topic = self.by_name[record.topic]
            if topic in self.raw_routes:
                raw_by_topic.setdefault(topic, []).append(record)
                continue
            raw = record.value or b""
            try:
                event = decode(topic, raw)
            except EventDecodeError as exc:
                log.warning("%s: dead-lettering a message of %s: %s", self.bus.service, topic.name, exc)
                pending.append(await self.bus.send_dead_letter(raw, record, str(exc)))
                continue
            tracing.observe(event, record.headers)  # later publications about its job carry its trace
            by_topic.setdefault(topic, []).append((event, record))
        for topic, batch in by_topic.items():
            for caused in await self._apply(self.routes[topic], batch):
                pending.append(await self.bus.send(caused))
        for topic, raw_batch in raw_by_topic.items():
            pending.extend(await self._apply_raw(self.raw_routes[topic], raw_batch))
        if pending:
            await asyncio.gather(*pending)
        spent = time.perf_counter() - began
        for topic_name in {record.topic for record in records}:
            count = sum(1 for record in records if record.topic == topic_name)
            metrics.handled(topic_name, [spent / len(records)] * count)

    async def _apply(self, handler: BatchHandler, batch: Sequence[tuple[Any, Record]]) -> list[Event]:
        events = [event for event, _ in batch]
        for attempt in range(1, HANDLER_ATTEMPTS + 1):
            try:
                return list(await handler(events))
            except asyncio.CancelledError:
                raise
            except Exception:  # the consumer must outlive any one batch
                log.exception("%s: batch handler failed (%d events, try %d)", self.bus.service, len(events), attempt)
                await asyncio.sleep(0.1 * attempt)
        return await self._one_by_one(handler, batch)

    async def _apply_raw(self, handler: RawBatchHandler, batch: Sequence[Record]) -> list[Awaitable[object]]:
        """A raw handler answers every record itself; one that raises is retried, then given the records one at a
        time, and a record it still cannot take is dead-lettered with the reason (never acknowledged unanswered).
        Raw handlers are idempotent by the record's offset, so what a failed try already sent is not sent twice."""
        for attempt in range(1, HANDLER_ATTEMPTS + 1):
            try:
                return list(await handler(batch))
            except asyncio.CancelledError:
                raise
            except Exception:  # the consumer must outlive any one batch
                log.exception(
                    "%s: raw batch handler failed (%d records, try %d)", self.bus.service, len(batch), attempt
                )
                await asyncio.sleep(0.1 * attempt)
        sent: list[Awaitable[object]] = []
        for record in batch:
            try:
                sent.extend(await handler([record]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("%s: handler failed on %s; dead-lettering it", self.bus.service, source_of(record))
                sent.append(await self.bus.send_dead_letter(record.value or b"", record, f"handler failed: {exc!r}"))
        return sent

    async def _one_by_one(self, handler: BatchHandler, batch: Sequence[tuple[Any, Record]]) -> list[Event]:
        """Isolate the events the handler cannot take: each is tried alone, and dead-lettered if it fails."""
        out: list[Event] = []
        for event, record in batch:
            try:
                out.extend(await handler([event]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("%s: handler failed on %s; dead-lettering it", self.bus.service, type(event).__name__)
                await (await self.bus.send_dead_letter(record.value or b"", record, f"handler failed: {exc!r}"))
        return out
