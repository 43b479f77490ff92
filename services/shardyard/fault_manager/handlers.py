"""Fault-manager handlers: facts to the book, its decisions to the bus."""

from shardyard.bus.kafka import Bus
from shardyard.clock import Clock
from shardyard.events import NodeLost, ShardFailed
from shardyard.fault_manager.book import FaultBook


class FaultHandlers:
    def __init__(self, book: FaultBook, bus: Bus, clock: Clock) -> None:
        self.book = book
        self.bus = bus
        self.clock = clock

    async def on_fact(self, event: object) -> None:
        self.book.apply(event)

    async def on_shard_event(self, event: object) -> None:
        if isinstance(event, ShardFailed):
            await self.bus.publish_all(self.book.on_shard_failed(event, self.clock.now()))

    async def on_failure(self, event: object) -> None:
        if isinstance(event, NodeLost):
            await self.bus.publish_all(self.book.on_node_lost(event, self.clock.now()))
