"""Follow topics: read every partition from its beginning and keep reading, without a consumer group.

This is how a replica keeps its whole state warm (a standby scheduler applies every fact the leader does, so that it
can lead the moment it is elected). Unlike a group subscription it sees every partition, and unlike a replay followed
by a subscription there is no gap between the two. ``caught_up()`` waits until everything written before the call
has been handed over.
"""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from shardyard import metrics, tracing
from shardyard.bus.assigned import assigned_consumer
from shardyard.bus.codec import TYPE_HEADER, decode
from shardyard.bus.forgotten import LogWatch
from shardyard.bus.quirks import fetch_wait_ms
from shardyard.bus.seal import checker, refused, screen
from shardyard.bus.topics import Topic
from shardyard.errors import EventDecodeError

log = logging.getLogger(__name__)

FollowHandler = Callable[[Topic, Any], Awaitable[None]]
RETRY_S = 0.5
"""How long a follower waits after a failed fetch before fetching again."""


def _type_of(headers: Sequence[tuple[str, bytes]]) -> str | None:
    return next((value.decode(errors="replace") for name, value in headers if name == TYPE_HEADER), None)


class Follower:
    def __init__(
        self,
        bootstrap: str,
        topics: Iterable[Topic],
        handle: FollowHandler,
        *,
        name: str,
        fetch_max_wait_ms: int | None = None,
        after_batch: Callable[[], Awaitable[None]] | None = None,
        unread: frozenset[str] = frozenset(),
    ) -> None:
        self.bootstrap = bootstrap
        self.unread = unread
        """Event types this follower has no use for (``codec.TYPE_HEADER``): their records are passed over unread.
        A record without the header (an older producer's) is read as ever."""
        self.fetch_max_wait_ms = fetch_max_wait_ms or fetch_wait_ms()
        self.after_batch = after_batch
        """Called once the records of one fetch were all handed over: where a handler publishes what a batch of
        facts caused, in one go, rather than one broker round trip per fact."""
        self.topics = {topic.name: topic for topic in topics}
        self.handle = handle
        self.name = name
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._done: dict[TopicPartition, int] = {}
        """Per partition: the offset after the last record handed over."""
        self._progress = asyncio.Event()
        self._stopped = False
        self._watch = LogWatch(name)
        self._seal = checker()
        """Checks each event's seal (``shardyard.bus.seal``): a refused one is skipped, logged and counted."""
        """Whether the broker still holds what was followed (``shardyard.bus.forgotten``)."""

    async def start(self) -> None:
        consumer, partitions = await assigned_consumer(
            self.bootstrap, self.topics.values(), fetch_max_wait_ms=self.fetch_max_wait_ms, client_id=self.name
        )
        self._done = dict.fromkeys(partitions, 0)
        self._consumer = consumer
        metrics.CONSUMER_LAG.track(self, group=None)
        self._task = asyncio.create_task(self._run(), name=self.name)

    @property
    def consumer(self) -> AIOKafkaConsumer | None:
        """The consumer while following (its lag is sampled for ``/metrics``)."""
        return self._consumer

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        self._stopped = True

    async def caught_up(self) -> None:
        """Return once every record written to the followed topics before this call has been handled (at once once
        stopped: a group's rebalance can call this while its replica shuts down)."""
        if self._consumer is None and self._stopped:
            return
        assert self._consumer is not None, "start() first"
        ends: dict[TopicPartition, int] = await self._consumer.end_offsets(list(self._done))
        while any(self._done[tp] < end for tp, end in ends.items()):
            self._progress.clear()
            await self._progress.wait()

    async def _run(self) -> None:
        """Follow until stopped. A fetch that fails (a busy or restarting broker) is retried: a follower that died
        would leave its replica's state behind the log, and ``caught_up`` waiting for ever."""
        while True:
            try:
                await self._follow_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: following failed; retrying", self.name)
                await asyncio.sleep(RETRY_S)

    async def _follow_once(self) -> None:
        assert self._consumer is not None
        batches = await self._consumer.getmany(timeout_ms=200)
        for tp, records in batches.items():
            self._watch.read(tp, (record.offset for record in records))  # a service exits on news of a lost log
            topic = self.topics[tp.topic]
            for record in records:
                await self._hand_over(
                    topic, tp, record.offset, record.value, record.headers, record.key, record.timestamp
                )
                self._done[tp] = record.offset + 1
        if batches and self.after_batch is not None:
            try:
                await self.after_batch()
            except asyncio.CancelledError:
                raise
            except Exception:  # a follower must outlive any one batch
                log.exception("%s: finishing a batch failed", self.name)
        for tp in self._done:
            # The fetch position also passes offsets that hold no record (compacted away): count those done.
            self._done[tp] = max(self._done[tp], await self._consumer.position(tp))
        self._progress.set()

    async def _hand_over(
        self,
        topic: Topic,
        tp: TopicPartition,
        offset: int,
        raw: bytes | None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        key: bytes | None = None,
        appended_ms: int | None = None,
    ) -> None:
        if self.unread and headers and _type_of(headers) in self.unread:
            return  # a fact of a type this follower never applies: not worth its decoding
        try:
            event = decode(topic, raw or b"")
        except EventDecodeError as exc:
            log.warning("%s skips %s@%d: %s", self.name, tp, offset, exc)
            return
        where = (tp.partition, offset)
        why = screen(self._seal, topic.name, key, raw or b"", headers, event, appended_ms=appended_ms, where=where)
        if why is not None:
            log.warning("%s skips %s@%d: %s", self.name, tp, offset, refused(why, topic.name, headers))
            return
        tracing.observe(event, headers)  # what the handler publishes about its job continues the job's trace
        metrics.CONSUMER_LAG.ensure_sampling()
        try:
            with metrics.handling(topic.name):
                await self.handle(topic, event)
        except asyncio.CancelledError:
            raise
        except Exception:  # a follower must outlive any one event
            log.exception("%s: handling %s@%d failed", self.name, tp, offset)
