"""The consumer-group listener of replicas that split their work by key: what they own after each rebalance."""

from __future__ import annotations

import asyncio

from aiokafka import TopicPartition

from shardyard.bus.ownership import Ownership
from shardyard.bus.topics import HEARTBEATS, SUBMISSIONS


class Replica:
    def __init__(self) -> None:
        self.owned: frozenset[int] | None = frozenset()
        self.history: list[frozenset[int]] = []

    async def assign(self, partitions: frozenset[int]) -> None:
        self.owned = partitions
        self.history.append(partitions)


def parts(topic: str, *numbers: int) -> list[TopicPartition]:
    return [TopicPartition(topic, n) for n in numbers]


async def test_partitions_given_are_owned_only_once_the_replica_has_caught_up() -> None:
    replica, read = Replica(), asyncio.Event()

    async def caught_up() -> None:
        await read.wait()

    listener = Ownership(SUBMISSIONS, replica.assign, lambda: replica.owned, who="queue q-0", caught_up=caught_up)
    given = asyncio.create_task(listener.on_partitions_assigned(parts(SUBMISSIONS.name, 1, 3)))
    await asyncio.sleep(0)  # the listener runs up to its wait for the log
    assert replica.owned == frozenset() and not given.done()
    read.set()
    await given
    assert replica.owned == frozenset({1, 3})


async def test_a_rebalance_takes_partitions_away_then_gives_the_new_assignment_whole() -> None:
    replica = Replica()
    listener = Ownership(SUBMISSIONS, replica.assign, lambda: replica.owned, who="queue q-0")
    await listener.on_partitions_assigned(parts(SUBMISSIONS.name, 0, 1, 2, 3))
    # Partitions of another topic of the same consumer are not this listener's business.
    await listener.on_partitions_revoked([*parts(SUBMISSIONS.name, 0, 1, 2, 3), *parts(HEARTBEATS.name, 0)])
    assert replica.owned == frozenset()
    await listener.on_partitions_assigned([*parts(SUBMISSIONS.name, 2, 3), *parts(HEARTBEATS.name, 1)])
    assert replica.history == [frozenset({0, 1, 2, 3}), frozenset(), frozenset({2, 3})]
