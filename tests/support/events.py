"""Publishing events to and watching topics of a real broker, with deadlines."""

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from shardyard.bus.assigned import partitions_of
from shardyard.bus.codec import decode, encode, key_of, topic_of
from shardyard.bus.topics import CATALOGUE, Topic
from shardyard.bus.transport import client_options
from shardyard.events import Event
from tests.support import wait


class Producer:
    def __init__(self, bootstrap: str) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, **client_options()
        )

    async def __aenter__(self) -> "Producer":
        await self._producer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._producer.stop()

    async def event(self, event: Event) -> None:
        await self._producer.send_and_wait(topic_of(event).name, encode(event), key=key_of(event))

    async def raw(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Any:
        return await self._producer.send_and_wait(topic, value, key=key, partition=partition, headers=headers)


class Watcher:
    """Reads topics from the beginning (no group) and keeps every decoded event; ``until`` waits for a condition."""

    def __init__(self, bootstrap: str, topics: Sequence[Topic]) -> None:
        self.topics = {t.name: t for t in topics}
        self.events: list[Any] = []
        self.raw: list[tuple[str, bytes, dict[str, bytes]]] = []
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest", **client_options()
        )
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> "Watcher":
        await self._consumer.start()
        partitions = await partitions_of(self._consumer, self.topics)
        self._consumer.assign(partitions)
        await self._consumer.seek_to_beginning(*partitions)
        self._task = asyncio.create_task(self._pump())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task:
            self._task.cancel()
        await self._consumer.stop()

    async def _pump(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=100)
            for tp, records in batches.items():
                for record in records:
                    headers = {k: v for k, v in (record.headers or ())}
                    self.raw.append((tp.topic, record.value, headers))
                    topic = self.topics[tp.topic]
                    if topic.payload is not None:
                        try:
                            self.events.append(decode(topic, record.value))
                        except Exception as exc:  # keep watching; the test asserts on what it needs
                            print(f"watcher: undecodable record on {tp.topic}: {exc}", file=sys.stderr)

    def of(self, kind: type, **fields: Any) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind) and all(getattr(e, k) == v for k, v in fields.items())]

    async def until(self, condition: Callable[[], Any], *, timeout_s: float = 30.0, what: str = "") -> Any:
        return await wait.eventually(
            condition, what or str(condition), timeout_s, describe=lambda: f"last events: {self.seen()}"
        )

    def seen(self) -> list[str]:
        return [type(e).__name__ for e in self.events][-30:]

    async def first(self, kind: type, *, timeout_s: float = 30.0, **fields: Any) -> Any:
        found = await self.until(lambda: self.of(kind, **fields), timeout_s=timeout_s, what=f"{kind.__name__} {fields}")
        return found[0]


async def eventually(probe: Callable[[], Awaitable[Any]], what: str, timeout_s: float = 30.0) -> Any:
    """``probe``'s first truthy answer within ``timeout_s``; an HTTP error (a 404 before the event arrived, a server
    not listening yet) counts as not yet."""
    return await wait.eventually(probe, what, timeout_s, tolerate=(OSError,))


def dumps(document: Any) -> bytes:
    return json.dumps(document).encode()


class Recorder:
    """A bus as handlers see it, in process: what they publish is kept (unit tests of pure handlers)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def publish(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


Where = tuple[str, int, int]
"""A record's place in the log: topic, partition, offset."""


def read_log(bootstrap: str, topics: Sequence[Topic] = CATALOGUE) -> dict[Where, bytes]:
    """Every record of ``topics`` as a reader of the broker sees it, by its place: to the end offsets each partition
    had when reading began (heartbeats keep coming, so reading to an empty fetch would never end). Tansu-only: its end
    offset can fall one produce batch short, so one fetch more follows (on Kafka it finds nothing more to count)."""
    from shardyard.bus.assigned import assigned_consumer

    async def read() -> dict[Where, bytes]:
        consumer, partitions = await assigned_consumer(bootstrap, topics, fetch_max_wait_ms=200)
        found: dict[Where, bytes] = {}

        def keep(batches: dict[Any, list[Any]]) -> None:
            for tp, records in batches.items():
                found.update({(tp.topic, tp.partition, r.offset): r.value or b"" for r in records})

        try:
            ends = await consumer.end_offsets(partitions)
            pending = {tp for tp, end in ends.items() if end > 0}
            deadline = asyncio.get_running_loop().time() + 60
            while pending:
                assert asyncio.get_running_loop().time() < deadline, f"still unread: {sorted(map(str, pending))}"
                keep(await consumer.getmany(*pending, timeout_ms=500, max_records=10_000))
                for tp in list(pending):
                    if await consumer.position(tp) >= ends[tp]:
                        pending.discard(tp)
            keep(await consumer.getmany(timeout_ms=1000, max_records=10_000))
        finally:
            await consumer.stop()
        return found

    return asyncio.run(read())
