"""A follower outlives a failed fetch: it fetches again, and ``caught_up`` still returns (a follower that died would
leave a scheduler taking over waiting for ever)."""

import asyncio
from dataclasses import dataclass

from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError

from shardyard.bus.follow import Follower
from shardyard.bus.topics import LIFECYCLE

PARTITION = TopicPartition(LIFECYCLE.name, 0)


@dataclass
class FlakyConsumer:
    """Its first fetch fails as a busy broker's would; after that the partition's one record (offset 0) is read."""

    fetches: int = 0

    async def getmany(self, timeout_ms: int) -> dict[TopicPartition, list[object]]:
        self.fetches += 1
        await asyncio.sleep(0.01)
        if self.fetches == 1:
            raise KafkaTimeoutError()
        return {}

    async def position(self, _tp: TopicPartition) -> int:
        return 0 if self.fetches < 3 else 1

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(partitions, 1)


async def _ignore(_topic: object, _event: object) -> None:
    return None


async def test_a_follower_fetches_again_after_a_failed_fetch_and_catches_up() -> None:
    follower = Follower("unused:9092", [LIFECYCLE], _ignore, name="test-follower")
    consumer = FlakyConsumer()
    follower._consumer = consumer
    follower._done = {PARTITION: 0}
    task = asyncio.get_running_loop().create_task(follower._run())
    try:
        await asyncio.wait_for(follower.caught_up(), timeout=5)
    finally:
        task.cancel()

    assert consumer.fetches >= 3
