"""A batch consumer outlives any one message: a raw handler (the queue's submissions) that raises on one record is
retried, then given the records one at a time, and only the record it still cannot take is dead-lettered, with the
reason. Nothing is acknowledged unanswered. Pure logic of ``shardyard.bus.batch``: the sender is a recorder."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, cast

from aiokafka import ConsumerRecord, TopicPartition
from faststream.kafka import KafkaBroker

from shardyard.bus.batch import AfterBatch, BatchConsumer, Record
from shardyard.bus.kafka import MAX_DEAD_LETTER_BYTES, Bus
from shardyard.bus.topics import SUBMISSIONS
from shardyard.events import Event


def record(offset: int, value: bytes) -> Record:
    return ConsumerRecord(SUBMISSIONS.name, 0, offset, 0, 0, None, value, None, 0, len(value), [])


class Recorder:
    service = "queue"

    def __init__(self) -> None:
        self.dead: list[tuple[bytes, int, str]] = []

    async def send(self, event: Event) -> asyncio.Future[Any]:
        raise AssertionError("raw handlers send for themselves")

    async def send_dead_letter(self, raw: bytes, rec: Record, error: str) -> asyncio.Future[Any]:
        self.dead.append((raw, rec.offset, error))
        return _done()


def _done() -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


def test_one_poison_record_is_dead_lettered_and_the_rest_answered() -> None:
    answered: list[int] = []

    async def handler(records: Sequence[Record]) -> list[Awaitable[object]]:
        if any(r.value == b"poison" for r in records):
            raise RecursionError("maximum recursion depth exceeded")
        answered.extend(r.offset for r in records)
        return [_done() for _ in records]

    async def run() -> Recorder:
        bus = Recorder()
        consumer = BatchConsumer(bus, {}, {SUBMISSIONS: handler})
        await consumer.handle([record(0, b"a"), record(1, b"poison"), record(2, b"b")])
        return bus

    bus = asyncio.run(run())

    assert answered == [0, 2]
    assert [(raw, offset) for raw, offset, _ in bus.dead] == [(b"poison", 1)]
    assert "RecursionError" in bus.dead[0][2]


def test_a_handler_that_recovers_on_retry_dead_letters_nothing() -> None:
    calls: list[int] = []

    async def flaky(records: Sequence[Record]) -> list[Awaitable[object]]:
        calls.append(len(records))
        if len(calls) == 1:
            raise ConnectionError("transient")
        return []

    async def run() -> Recorder:
        bus = Recorder()
        await BatchConsumer(bus, {}, {SUBMISSIONS: flaky}).handle([record(0, b"a"), record(1, b"b")])
        return bus

    bus = asyncio.run(run())

    assert calls == [2, 2]
    assert bus.dead == []


class Producer:
    """What ``Bus`` asks of FastStream's broker to publish: the arguments of each publication."""

    def __init__(self) -> None:
        self.published: list[tuple[bytes, dict[str, Any]]] = []

    async def publish(self, raw: bytes, **options: Any) -> None:
        self.published.append((raw, options))


def test_a_dead_letter_of_a_huge_message_keeps_its_head_and_says_how_large_it_was() -> None:
    producer = Producer()
    bus = Bus(cast(KafkaBroker, producer), service="queue")
    huge = b"x" * (10 * 1024 * 1024)

    async def run() -> None:
        await (await bus.send_dead_letter(huge, record(7, huge), "handler failed"))
        await (await bus.send_dead_letter(b"small", record(8, b"small"), "handler failed"))

    asyncio.run(run())

    (big, big_options), (small, small_options) = producer.published
    assert len(big) == MAX_DEAD_LETTER_BYTES
    assert big_options["headers"]["x-shardyard-truncated"] == str(len(huge))
    assert big_options["headers"]["x-shardyard-source"] == f"{SUBMISSIONS.name}/0/7"
    assert small == b"small"
    assert "x-shardyard-truncated" not in small_options["headers"]


def test_a_rebalance_waits_for_the_batch_in_hand_and_drops_what_it_no_longer_holds() -> None:
    handled: list[tuple[int, int]] = []
    release = asyncio.Event()

    async def handler(records: Sequence[Record]) -> list[Awaitable[object]]:
        await release.wait()
        handled.extend((r.partition, r.offset) for r in records)
        return []

    def on(partition: int, offset: int) -> Record:
        return ConsumerRecord(SUBMISSIONS.name, partition, offset, 0, 0, None, b"x", None, 0, 1, [])

    async def run() -> list[str]:
        consumer = BatchConsumer(Recorder(), {}, {SUBMISSIONS: handler})
        listener = AfterBatch(consumer, None)
        steps: list[str] = []
        early = asyncio.create_task(consumer.handle([on(0, 0)]))  # fetched before the first assignment is taken
        await asyncio.sleep(0.05)
        steps.append(f"before assignment: {len(handled)} handled")
        await listener.on_partitions_assigned(
            [TopicPartition(SUBMISSIONS.name, 0), TopicPartition(SUBMISSIONS.name, 1)]
        )
        in_hand = asyncio.create_task(consumer.handle([on(1, 5)]))
        await asyncio.sleep(0.05)
        revoking = asyncio.create_task(listener.on_partitions_revoked([]))
        await asyncio.sleep(0.05)
        steps.append(f"revocation done while a batch is in hand: {revoking.done()}")
        release.set()
        await asyncio.gather(early, in_hand, revoking)
        stale = asyncio.create_task(consumer.handle([on(1, 6), on(0, 9)]))  # fetched before the new assignment
        await listener.on_partitions_assigned([TopicPartition(SUBMISSIONS.name, 0)])
        await stale
        return steps

    steps = asyncio.run(run())

    assert steps == ["before assignment: 0 handled", "revocation done while a batch is in hand: False"]
    assert handled == [(0, 0), (1, 5), (0, 9)]  # partition 1's offset 6 went to its new owner
