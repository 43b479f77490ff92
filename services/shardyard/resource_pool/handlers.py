"""Resource-pool handlers: heartbeats and drain requests in, node state out; the ledger follows assignments and
shard ends."""

from shardyard.bus.kafka import Bus
from shardyard.clock import Clock
from shardyard.events import Heartbeat, NodeDrain
from shardyard.resource_pool.book import PoolBook


class PoolHandlers:
    def __init__(self, book: PoolBook, bus: Bus, clock: Clock) -> None:
        self.book = book
        self.bus = bus
        self.clock = clock

    async def on_heartbeat(self, event: Heartbeat | NodeDrain) -> None:
        """The heartbeats topic carries agents' heartbeats and operators' drain requests, both keyed by node."""
        now = self.clock.now()
        match event:
            case NodeDrain():
                await self.bus.publish_all(self.book.on_drain(event, now))
            case Heartbeat():
                await self.bus.publish_all(self.book.on_heartbeat(event, now))

    async def on_ledger_event(self, event: object) -> None:
        await self.bus.publish_all(self.book.on_ledger_event(event, self.clock.now()))

    async def tick(self) -> None:
        await self.bus.publish_all(self.book.tick(self.clock.now()))
