"""News of a log the broker forgot (``shardyard.bus.forgotten``): an offset that goes back, read without a group."""

from collections.abc import Iterator

import pytest
from aiokafka import TopicPartition

from shardyard.bus import forgotten
from shardyard.bus.forgotten import LogWatch

TP = TopicPartition("shardyard.jobs.lifecycle", 2)


@pytest.fixture
def told() -> Iterator[list[str]]:
    heard: list[str] = []
    forgotten.react_with(heard.append)
    yield heard
    forgotten.react_with(forgotten._log_only)


def test_offsets_read_in_order_and_other_partitions_are_no_news(told: list[str]) -> None:
    watch = LogWatch("queue-0-follow")
    watch.read(TP, [0, 1, 2])
    watch.read(TP, [3, 7])  # compacted away in between: still forward
    watch.read(TopicPartition(TP.topic, 0), [0])
    assert told == []
    assert watch.read_to == {TP: 8, TopicPartition(TP.topic, 0): 1}


def test_an_offset_below_one_read_is_told_once_and_names_where(told: list[str]) -> None:
    watch = LogWatch("queue-0-follow")
    watch.read(TP, [0, 1, 2, 3, 4])
    watch.read(TP, [0, 1])  # the broker came back empty and this is its new log
    watch.read(TP, [0])
    assert len(told) == 1, told
    assert "queue-0-follow read shardyard.jobs.lifecycle[2] to offset 5, then offset 0" in told[0]
