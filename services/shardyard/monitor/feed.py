"""The monitor's reader: every topic it shows, in batches, without a consumer group.

Every replica reads every partition (no group: no rebalances, nothing to commit) and folds what it reads, so replaying
the topics from their beginning rebuilds its view. One topic is read from its end instead: the heartbeats. It only
grows (one message a node a second, 86 million a day at 1,000 nodes), and a heartbeat matters only until the node's
next one, which comes within the second; each node's last known state, receipt of its last heartbeat included, is on
the compacted node-state topic, which is read from its beginning.

Records are handed over in batches of one partition's run (``getmany``): at 1,000 nodes the monitor reads two
thousand messages a second (heartbeats and the node states they cause), and a handler called per batch pays the
per-message costs of a framework (a task hop, a dependency-injection call, metric label lookups) once per batch.
"""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeAlias

from aiokafka import AIOKafkaConsumer, ConsumerRecord

from shardyard.bus.assigned import assigned_consumer
from shardyard.bus.forgotten import LogWatch
from shardyard.bus.quirks import fetch_wait_ms
from shardyard.bus.topics import Topic

log = logging.getLogger(__name__)

Record: TypeAlias = ConsumerRecord[bytes, bytes]
BatchHandler = Callable[[Topic, Sequence[Record]], Awaitable[None]]

MAX_RECORDS = 500
"""Records handed over between two turns of the event loop: while catching up a batch is always ready, and the
status API answers between batches (500 records fold in tens of milliseconds)."""
POLL_MS = 1000


class Feed:
    def __init__(
        self,
        bootstrap: str,
        topics: Iterable[Topic],
        handle: BatchHandler,
        *,
        name: str,
        from_end: Iterable[Topic] = (),
        max_records: int = MAX_RECORDS,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = {topic.name: topic for topic in topics}
        self.from_end = {topic.name for topic in from_end}
        self.handle = handle
        self.name = name
        self.max_records = max_records
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._watch = LogWatch(name)

    @property
    def consumer(self) -> AIOKafkaConsumer | None:
        """The consumer while reading (its lag is sampled, for the CONSUMER_LAG rule and ``/metrics``)."""
        return self._consumer

    async def start(self) -> None:
        """Assign every partition and position it; what is published once this returns will be read."""
        consumer, _ = await assigned_consumer(
            self.bootstrap,
            self.topics.values(),
            fetch_max_wait_ms=fetch_wait_ms(),
            client_id=self.name,
            from_end=[topic for topic in self.topics.values() if topic.name in self.from_end],
        )
        self._consumer = consumer
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def _run(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=POLL_MS, max_records=self.max_records)
            for tp, records in batches.items():
                self._watch.read(tp, (record.offset for record in records))  # news of a lost log: see forgotten
                try:
                    await self.handle(self.topics[tp.topic], records)
                except asyncio.CancelledError:
                    raise
                except Exception:  # the handler answers bad records itself; this is a bug, and reading goes on
                    log.exception("%s: handling %d records of %s failed", self.name, len(records), tp)
            await asyncio.sleep(0)
