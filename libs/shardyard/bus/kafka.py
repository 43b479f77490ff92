"""The thin layer over FastStream/aiokafka every service uses.

- ``make_broker``: a FastStream KafkaBroker with idempotence off (Tansu, the embedded broker, has no InitProducerId;
  every handler is idempotent instead, so Kafka needs none either).
- ``Bus.publish``: encode an event and send it to its topic under its key; ``Bus.publish_all`` hands every event to
  the producer first and then awaits their acknowledgements: one broker round trip for the lot, not one per event.
- ``Bus.subscribe``: commit-after-processing subscriptions; a message that does not decode goes to the dead-letter
  topic and is then acknowledged, a handler that keeps failing does the same: a consumer never dies on a message.
- ``Bus.subscribe_batch``: the same guarantees for busy topics, a batch at a time (see :mod:`shardyard.bus.batch`).
- Trace context rides in the headers of every event about a job, both ways (see :mod:`shardyard.tracing`).
"""

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeAlias

from aiokafka import ConsumerRecord
from aiokafka.abc import ConsumerRebalanceListener
from faststream.kafka import KafkaBroker, KafkaMessage
from faststream.middlewares import AckPolicy

from shardyard import metrics, tracing
from shardyard.bus.batch import BATCH_TIMEOUT_MS, MAX_RECORDS, AfterBatch, BatchConsumer, BatchHandler, RawBatchHandler
from shardyard.bus.codec import TYPE_HEADER, decode, encode, key_of, topic_of
from shardyard.bus.quirks import fetch_wait_ms
from shardyard.bus.seal import FORGED_HEADER, Refusal, Seal, for_component, refused, screen_read
from shardyard.bus.topics import DEADLETTER, Topic, dead_letterer
from shardyard.bus.transport import faststream_security
from shardyard.errors import EventDecodeError
from shardyard.events import Event

log = logging.getLogger(__name__)

Handler = Callable[[Any], Awaitable[None]]
RawHandler = Callable[[bytes, KafkaMessage], Awaitable[None]]

# Group timings: a member is declared dead after the session timeout. Tansu-only: the embedded broker completes a
# join only after the rebalance timeout (Kafka as soon as every member rejoined), so keep it short (and give each
# service one group membership, see ``Bus.subscribe``).
GROUP_OPTIONS: dict[str, Any] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 500,
    "rebalance_timeout_ms": 3000,
}
HANDLER_ATTEMPTS = 3
MAX_BATCH_BYTES = 1024 * 1024
"""The producer's batch per partition (Kafka's default ``message.max.bytes`` is about this)."""
MAX_DEAD_LETTER_BYTES = 64 * 1024
"""A dead letter keeps this much of its message at most: enough to see what it was, always under the broker's limit."""


def _pending(sent: object) -> "asyncio.Future[Any]":
    """The acknowledgement of a send as a future: what aiokafka returns, or a done one where the producer answered
    at once (FastStream's in-memory test broker returns nothing)."""
    if isinstance(sent, asyncio.Future):
        return sent
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    done.set_result(sent)
    return done


async def confirmed(futures: Sequence["asyncio.Future[Any]"]) -> None:
    """Wait for the broker's acknowledgement of every send in ``futures``; the first failure is raised."""
    if futures:
        await asyncio.gather(*futures)


def make_broker(bootstrap: str, *, client_id: str, middlewares: Sequence[Any] = ()) -> KafkaBroker:
    return KafkaBroker(
        bootstrap,
        client_id=client_id,
        enable_idempotence=False,
        acks="all",
        # Topics come from the catalogue (``bus.admin.ensure_topics``), with their partitions and retention; a
        # subscriber creating its own would get the broker's defaults (and is refused on a secured broker).
        allow_auto_create_topics=False,
        # A partition's batch that is full blocks every later send to it until the broker acknowledged it: a
        # scheduling cycle's thousands of assignments would go out 16 KiB (aiokafka's default) a round trip.
        max_batch_size=MAX_BATCH_BYTES,
        middlewares=tuple(middlewares),
        security=faststream_security(),  # TLS and SASL from the environment (``shardyard.bus.transport``)
        logger=logging.getLogger("shardyard.bus.faststream"),
        log_level=logging.DEBUG,  # one line per message is noise at 1 Hz heartbeats per node
    )


async def _raw_body(message: KafkaMessage) -> bytes:
    """Hand handlers the message's bytes untouched; decoding is the codec's job, not FastStream's."""
    return bytes(message.body)


async def _no_body(_message: KafkaMessage) -> None:
    """A batch's records are read from the message itself (``raw_message``): nothing to decode per body."""
    return None


Records: TypeAlias = "ConsumerRecord[bytes, bytes] | tuple[ConsumerRecord[bytes, bytes], ...]"


async def _any_headers(message: Records, parse: Callable[[Records], Awaitable[Any]]) -> Any:
    """FastStream's parsing, for a record or a batch with a header value that is not UTF-8 too: FastStream decodes
    every header value as UTF-8, and one that is not (anyone can produce one) would fail the batch before any handler
    saw it, again at each redelivery. Its own view then gets the value with the bytes replaced; the handlers read
    the records as they came (``raw_message``), so the seal and signature checks see the real bytes."""
    try:
        return await parse(message)
    except UnicodeDecodeError:
        records = message if isinstance(message, tuple) else (message,)
        readable = tuple(
            dataclasses.replace(r, headers=[(k, v.decode(errors="replace").encode()) for k, v in r.headers])
            for r in records
        )
        parsed = await parse(readable if isinstance(message, tuple) else readable[0])
        parsed.raw_message = message
        return parsed


def source_record(message: KafkaMessage) -> ConsumerRecord[bytes, bytes]:
    """The Kafka record behind a (non-batch) FastStream message."""
    record = message.raw_message
    assert not isinstance(record, tuple), "batch subscribers are not used"
    return record


def source_of(message: KafkaMessage) -> str:
    """``topic/partition/offset``: where a message came from, stable across redeliveries."""
    return source_of_record(source_record(message))


def source_of_record(record: ConsumerRecord[bytes, bytes]) -> str:
    return f"{record.topic}/{record.partition}/{record.offset}"


class Bus:
    """Publishing and subscribing for one service process."""

    def __init__(
        self, broker: KafkaBroker, *, service: str, component: str | None = None, seal: Seal | None = None
    ) -> None:
        self.broker = broker
        self.service = service
        self.seal = seal if seal is not None else for_component(service, component or service)
        """What seals this process's events and checks those it consumes (``shardyard.bus.seal``): from the
        cluster secret the environment names; None without one (nothing sealed or checked)."""

    async def send(self, event: Event) -> "asyncio.Future[Any]":
        """Hand ``event`` to the producer and return without waiting for the broker: the future resolves once the
        broker acknowledged it. Sends keep their order within a partition. An event about a job carries the job's
        trace context in its headers (taken now, from the span current at the call)."""
        kind = str(getattr(event, "type"))  # noqa: B009 - every event class has one
        headers = {**(tracing.headers_for(event) or {}), TYPE_HEADER: kind}
        name, body, key = topic_of(event).name, encode(event), key_of(event)
        if self.seal is not None:
            headers |= self.seal.headers(name, key, body)
        future = _pending(await self.broker.publish(body, topic=name, key=key, headers=headers, no_confirm=True))
        metrics.EVENTS_PUBLISHED.labels(name).inc()
        metrics.CONSUMER_LAG.ensure_sampling()
        return future

    async def publish(self, event: Event) -> None:
        """Send ``event`` and wait until the broker has it."""
        await (await self.send(event))

    async def publish_raw(
        self, raw: bytes, topic: Topic, *, key: str, partition: int, headers: Mapping[str, str]
    ) -> None:
        """Send bytes that are not an event (a user's submission, forwarded) to one partition of ``topic``."""
        await (await self.send_raw(raw, topic, key=key, partition=partition, headers=headers))

    async def send_raw(
        self, raw: bytes, topic: Topic, *, key: str, partition: int, headers: Mapping[str, str]
    ) -> "asyncio.Future[Any]":
        """``publish_raw`` without waiting for the broker: the future resolves once it has the bytes."""
        future = _pending(
            await self.broker.publish(
                raw, topic=topic.name, key=key.encode(), partition=partition, headers=dict(headers), no_confirm=True
            )
        )
        metrics.EVENTS_PUBLISHED.labels(topic.name).inc()
        return future

    async def publish_all(self, events: Sequence[Event]) -> None:
        """Send ``events`` in order and wait until the broker has every one: all are handed to the producer before
        any acknowledgement is awaited, so the producer batches them (one round trip per partition, not per event)."""
        await confirmed([await self.send(event) for event in events])

    async def dead_letter(self, raw: bytes, message: KafkaMessage, error: str) -> None:
        await self.dead_letter_record(raw, source_record(message), error)

    async def dead_letter_record(self, raw: bytes, record: ConsumerRecord[bytes, bytes], error: str) -> None:
        """Dead-letter a record read without FastStream (the monitor reads its topics in batches)."""
        await (await self.send_dead_letter(raw, record, error))

    async def send_dead_letter(
        self, raw: bytes, record: ConsumerRecord[bytes, bytes], error: str, *, forged: Refusal | None = None
    ) -> "asyncio.Future[Any]":
        """Hand a dead letter to the producer; the future resolves once the broker has it. A message too large to
        send whole keeps its first ``MAX_DEAD_LETTER_BYTES`` (``x-shardyard-truncated`` gives its size); the
        source header names where the whole of it still lies in the log. ``forged``: an event refused for its seal
        (``x-shardyard-forged``, which the monitor counts for ``FORGED_EVENTS``); the dead letter is sealed."""
        headers = {
            "x-shardyard-error": error[:2000],
            "x-shardyard-source": f"{record.topic}/{record.partition}/{record.offset}",
            "x-shardyard-service": self.service,
        }
        if len(raw) > MAX_DEAD_LETTER_BYTES:
            headers["x-shardyard-truncated"] = str(len(raw))
            raw = raw[:MAX_DEAD_LETTER_BYTES]
        if forged is not None:
            headers[FORGED_HEADER] = forged.value
        if self.seal is not None:
            headers |= self.seal.headers(DEADLETTER.name, record.key, raw)
        future = _pending(
            await self.broker.publish(raw, topic=DEADLETTER.name, key=record.key, headers=headers, no_confirm=True)
        )
        metrics.EVENTS_DEAD_LETTERED.labels(record.topic).inc()
        return future

    async def refuse(self, raw: bytes, record: ConsumerRecord[bytes, bytes], why: Refusal) -> None:
        """Dead-letter an event refused for its seal (``screen`` counted it)."""
        await (await self.send_refused(raw, record, why))

    async def send_refused(
        self, raw: bytes, record: ConsumerRecord[bytes, bytes], why: Refusal
    ) -> "asyncio.Future[Any]":
        error = refused(why, record.topic, record.headers)
        log.warning("%s: %s", self.service, error)
        return await self.send_dead_letter(raw, record, error, forged=why)

    async def _bad(self, raw: bytes, record: ConsumerRecord[bytes, bytes], topic: Topic, why: str | Refusal) -> None:
        """A bad record read: dead-lettered where this service is the topic's dead-letterer (``dead_letterer``),
        else only logged (its dead letter is another reader's)."""
        if dead_letterer(topic.name) != self.service:
            log.warning("%s skips %s/%d/%d: %s", self.service, record.topic, record.partition, record.offset, why)
        elif isinstance(why, Refusal):
            await self.refuse(raw, record, why)
        else:
            log.warning("%s: dead-lettering a message of %s: %s", self.service, topic.name, why)
            await self.dead_letter_record(raw, record, why)

    def subscribe(
        self,
        routes: Mapping[Topic, Handler],
        *,
        group: str | None,
        raw_routes: Mapping[Topic, RawHandler] | None = None,
        from_beginning: bool = True,
        listener: ConsumerRebalanceListener | None = None,
        group_options: Mapping[str, Any] | None = None,
        job_path: bool = False,
    ) -> None:
        """One consumer (one group membership) for several topics: each message of a topic in ``routes`` is
        decoded and handed to that topic's handler; ``raw_routes`` handlers get the bytes. With a group, offsets are
        committed only after the handler returns; ``listener`` hears of the group's partitions given and taken;
        ``group_options`` override :data:`GROUP_OPTIONS` (timeouts)."""
        raw_routes = dict(raw_routes or {})
        by_name = {topic.name: topic for topic in [*routes, *raw_routes]}

        async def on_message(body: bytes, message: KafkaMessage) -> None:
            topic = by_name[source_record(message).topic]
            if topic in raw_routes:
                await raw_routes[topic](body, message)
                return
            record = source_record(message)
            try:
                event = decode(topic, body)
            except EventDecodeError as exc:
                await self._bad(body, record, topic, str(exc))
                return
            why = screen_read(self.seal, topic.name, record, body, event)
            if why is not None:
                await self._bad(body, record, topic, why)
                return
            tracing.observe(event, record.headers)  # later publications about its job carry it
            await self._call(routes[topic], event, body, message)

        async def measured(body: bytes, message: KafkaMessage) -> None:
            # Counted and timed here, once for every service: consumed, handler seconds, and lag sampling.
            metrics.CONSUMER_LAG.ensure_sampling()
            with metrics.handling(source_record(message).topic):
                await on_message(body, message)

        options: dict[str, Any] = {**GROUP_OPTIONS, **(group_options or {})} if group else {}
        options["fetch_max_wait_ms"] = fetch_wait_ms(job_path=job_path)
        if listener is not None:
            options["listener"] = listener
        subscriber = self.broker.subscriber(
            *by_name,
            group_id=group,
            ack_policy=AckPolicy.ACK if group else AckPolicy.ACK_FIRST,
            auto_offset_reset="earliest" if from_beginning else "latest",
            decoder=_raw_body,
            parser=_any_headers,
            **options,
        )
        subscriber(measured)
        metrics.CONSUMER_LAG.track(subscriber, group=group)

    def subscribe_batch(
        self,
        routes: Mapping[Topic, BatchHandler],
        *,
        group: str,
        raw_routes: Mapping[Topic, RawBatchHandler] | None = None,
        listener: ConsumerRebalanceListener | None = None,
        group_options: Mapping[str, Any] | None = None,
        max_records: int = MAX_RECORDS,
        batch_timeout_ms: int = BATCH_TIMEOUT_MS,
        from_beginning: bool = True,
        job_path: bool = False,
    ) -> None:
        """One group membership for busy topics, read a batch at a time: each topic's handler takes the batch's
        events of its topic and returns the events they cause; those are published without awaiting each, and the
        batch is committed once they are all acknowledged (see :mod:`shardyard.bus.batch`)."""
        consumer = BatchConsumer(self, routes, raw_routes, seal=self.seal)

        async def on_batch(_body: Any, message: KafkaMessage) -> None:
            records = message.raw_message
            metrics.CONSUMER_LAG.ensure_sampling()
            await consumer.handle(records if isinstance(records, tuple) else (records,))

        options: dict[str, Any] = {
            **GROUP_OPTIONS,
            **(group_options or {}),
            "fetch_max_wait_ms": fetch_wait_ms(job_path=job_path),
        }
        options["listener"] = AfterBatch(consumer, listener)
        subscriber = self.broker.subscriber(
            *consumer.by_name,
            group_id=group,
            batch=True,
            max_records=max_records,
            batch_timeout_ms=batch_timeout_ms,
            ack_policy=AckPolicy.ACK,
            auto_offset_reset="earliest" if from_beginning else "latest",
            decoder=_no_body,
            parser=_any_headers,
            **options,
        )
        subscriber(on_batch)
        metrics.CONSUMER_LAG.track(subscriber, group=group)

    async def _call(self, handler: Handler, event: Any, raw: bytes, message: KafkaMessage) -> None:
        for attempt in range(1, HANDLER_ATTEMPTS + 1):
            try:
                await handler(event)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the consumer must outlive any one message
                log.exception("%s: handler failed on %s (attempt %d)", self.service, type(event).__name__, attempt)
                if attempt == HANDLER_ATTEMPTS:
                    await self.dead_letter(raw, message, f"handler failed: {exc!r}")
                    return
                await asyncio.sleep(0.1 * attempt)
