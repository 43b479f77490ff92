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
replica, which reads the batch again. A replica that is only asked to give its partitions up (a rebalance) first
finishes the batch in hand, its results acknowledged, and handles nothing more until its new assignment is taken
(``AfterBatch``): the next owner, which reads the facts to their end before it decides, then sees every answer the
batch gave, and gives none twice. Handlers must therefore be idempotent, as every Shardyard handler is. A handler
that raises is retried on the same events; if it keeps failing, its events are tried one at a time and the ones that
still fail are dead-lettered, so one poison message costs its own place in the log and nothing else.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias

from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener

from shardyard import metrics, tracing
from shardyard.bus.codec import decode
from shardyard.bus.seal import Refusal, Seal, screen_read
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
YIELD_EVERY = 100
"""Records (or events sent) between two yields to the event loop within a batch: a sender hands records to the
producer without waiting, so a batch of a thousand would otherwise hold the loop for its whole length, and with it
the group heartbeats (on a loaded machine, past the session timeout: the member is thrown out mid-batch)."""


async def pace(count: int) -> None:
    """Let the loop run other tasks (the group heartbeat, the producer) after every ``YIELD_EVERY``-th item."""
    if count % YIELD_EVERY == YIELD_EVERY - 1:
        await asyncio.sleep(0)


class Sender(Protocol):
    service: str

    async def send(self, event: Event) -> "asyncio.Future[Any]": ...

    async def send_dead_letter(self, raw: bytes, record: Record, error: str) -> "asyncio.Future[Any]": ...

    async def send_refused(self, raw: bytes, record: Record, why: Refusal) -> "asyncio.Future[Any]": ...


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
        *,
        seal: Seal | None = None,
    ) -> None:
        self.bus = bus
        self.seal = seal
        """What checks each event's seal before it is applied (``shardyard.bus.seal``); None: nothing is checked."""
        self.routes = dict(routes)
        self.raw_routes = dict(raw_routes or {})
        self.by_name = {topic.name: topic for topic in [*self.routes, *self.raw_routes]}
        self._idle = asyncio.Event()
        self._idle.set()
        self._ready = asyncio.Event()
        self._ready.set()
        self._assigned: frozenset[tuple[str, int]] | None = None
        """The partitions this member holds, once its rebalance listener has taken them; None: not known."""

    async def settled(self) -> None:
        """Return once no batch is being handled: what the batch in hand causes is then on the bus."""
        await self._idle.wait()

    def pause(self) -> None:
        """Partitions are being taken away: handle nothing until the new assignment is taken (``resume``)."""
        self._ready.clear()

    def resume(self, assigned: frozenset[tuple[str, int]]) -> None:
        self._assigned = assigned
        self._ready.set()

    async def handle(self, records: Sequence[Record]) -> None:
        """Handle a batch once the member's assignment is settled, leaving out records of partitions it no longer
        holds (fetched before a rebalance): their new owner reads them again, and this member cannot commit them."""
        await self._ready.wait()
        if self._assigned is not None:
            records = [r for r in records if (r.topic, r.partition) in self._assigned]
        if not records:
            return
        self._idle.clear()
        try:
            await self._handle(records)
        finally:
            self._idle.set()

    async def _handle(self, records: Sequence[Record]) -> None:
        began = time.perf_counter()
        pending: list[Awaitable[object]] = []
        by_topic: dict[Topic, list[tuple[Any, Record]]] = {}
        raw_by_topic: dict[Topic, list[Record]] = {}
        for index, record in enumerate(records):
            await pace(index)
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
            why = screen_read(self.seal, topic.name, record, raw, event)
            if why is not None:
                pending.append(await self.bus.send_refused(raw, record, why))
                continue
            tracing.observe(event, record.headers)  # later publications about its job carry its trace
            by_topic.setdefault(topic, []).append((event, record))
        for topic, batch in by_topic.items():
            for index, caused in enumerate(await self._apply(self.routes[topic], batch)):
                await pace(index)
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


class AfterBatch(ConsumerRebalanceListener):
    """A group's rebalance listener around ``listener`` (if any) that keeps a batch consumer's work inside its
    assignment. Before partitions are given up, the batch in hand finishes and is acknowledged (aiokafka awaits the
    revocation before it rejoins, so nobody is given the partitions while this member still publishes what their
    records caused); after new ones are given, nothing is handled until ``listener`` has taken them (aiokafka starts
    fetching at once: an ``Ownership`` that first reads the facts to their end would otherwise decide too early)."""

    def __init__(self, consumer: BatchConsumer, listener: ConsumerRebalanceListener | None) -> None:
        self.consumer = consumer
        self.listener = listener
        consumer.pause()  # until the group's first assignment is taken

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.consumer.settled()
        self.consumer.pause()
        if self.listener is not None:
            await self.listener.on_partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        if self.listener is not None:
            await self.listener.on_partitions_assigned(assigned)
        self.consumer.resume(frozenset((tp.topic, tp.partition) for tp in assigned))
