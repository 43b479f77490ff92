"""Fault-manager handlers: facts to the book and the redundancy tracker, what they decide to the bus."""

from shardyard.bus.kafka import Bus
from shardyard.clock import Clock
from shardyard.fault_manager.book import FaultBook
from shardyard.fault_manager.redundancy import RedundancyTracker


class FaultHandlers:
    def __init__(self, book: FaultBook, redundancy: RedundancyTracker, bus: Bus, clock: Clock) -> None:
        self.book = book
        self.redundancy = redundancy
        self.bus = bus
        self.clock = clock

    async def on_fact(self, event: object) -> None:
        """Lifecycle and assignments: who runs where, which attempts are decided or over."""
        self.book.apply(event)

    async def on_shard_event(self, event: object) -> None:
        self.book.apply(event)
        self.redundancy.apply(event)
        await self.decide()

    async def on_node_event(self, event: object) -> None:
        """Node state (every replica reads all of it) and node-lost events."""
        self.book.apply(event)
        await self.decide()

    async def decide(self) -> None:
        await self.bus.publish_all(self.book.decide(self.clock.now()))

    async def tick(self) -> None:
        """Decisions that came due with time (the COMM_ERROR grace), and the redundancy ratio as the window moves."""
        now = self.clock.now()
        await self.bus.publish_all(self.book.decide(now))
        change = self.redundancy.check(now)
        if change is not None:
            await self.bus.publish(change)
