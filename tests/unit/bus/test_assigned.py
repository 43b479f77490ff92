"""A consumer without a group is assigned every partition of its topics, each at its beginning or its end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition

from shardyard.bus.assigned import assign_every_partition
from shardyard.bus.topics import HEARTBEATS, LIFECYCLE, NODE_STATE, Topic


@dataclass
class FakeMetadata:
    partitions: dict[str, set[int]]

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.partitions.get(topic)


@dataclass
class FakeClient:
    partitions: dict[str, set[int]]

    async def fetch_all_metadata(self) -> FakeMetadata:
        return FakeMetadata(self.partitions)


@dataclass
class FakeConsumer:
    """A started consumer whose broker knows ``partitions`` (per topic, in any order); it records what it is told."""

    partitions: dict[str, set[int]]
    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)

    @property
    def _client(self) -> FakeClient:
        return FakeClient(self.partitions)

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("assign", tuple(partitions)))

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self.calls.append(("beginning", partitions))

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        self.calls.append(("end", partitions))

    async def position(self, partition: TopicPartition) -> int:
        self.calls.append(("position", (partition,)))
        return 0


def tps(topic: Topic, *numbers: int) -> tuple[TopicPartition, ...]:
    return tuple(TopicPartition(topic.name, n) for n in numbers)


async def test_every_partition_is_assigned_in_topic_then_partition_order_from_the_beginning() -> None:
    consumer = FakeConsumer({LIFECYCLE.name: {2, 0, 3, 1}, NODE_STATE.name: {1, 0}})

    partitions = await assign_every_partition(consumer, [NODE_STATE, LIFECYCLE])

    expected = (*tps(NODE_STATE, 0, 1), *tps(LIFECYCLE, 0, 1, 2, 3))
    assert partitions == list(expected)
    assert consumer.calls == [("assign", expected), ("beginning", expected)]


async def test_topics_read_from_their_end_are_positioned_there_now() -> None:
    consumer = FakeConsumer({LIFECYCLE.name: {0, 1}, HEARTBEATS.name: {0, 1}})

    await assign_every_partition(consumer, [HEARTBEATS, LIFECYCLE], from_end=[HEARTBEATS])

    heartbeats = tps(HEARTBEATS, 0, 1)
    assert consumer.calls == [
        ("assign", (*heartbeats, *tps(LIFECYCLE, 0, 1))),
        ("beginning", tps(LIFECYCLE, 0, 1)),
        ("end", heartbeats),
        ("position", heartbeats[:1]),
        ("position", heartbeats[1:]),
    ]


@pytest.mark.parametrize(
    ("topics", "known"),
    [
        pytest.param([LIFECYCLE], {}, id="topic-not-in-metadata"),
        pytest.param([], {LIFECYCLE.name: {0}}, id="no-topics"),
    ],
)
async def test_no_partitions_none_positioned(topics: list[Topic], known: dict[str, set[int]]) -> None:
    consumer = FakeConsumer(known)

    assert await assign_every_partition(consumer, topics) == []
    assert consumer.calls == [("assign", ())]


async def test_a_topic_named_twice_is_assigned_once() -> None:
    consumer = FakeConsumer({LIFECYCLE.name: {0}})

    assert await assign_every_partition(consumer, [LIFECYCLE, LIFECYCLE]) == list(tps(LIFECYCLE, 0))
