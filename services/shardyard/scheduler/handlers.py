"""Scheduler handlers: apply each fact to the book, then publish what the book decides."""

from shardyard.bus.kafka import Bus
from shardyard.clock import Clock
from shardyard.events import JobCancelRequested, JobFailed, JobPreempted, JobReady, NodeState
from shardyard.lifecycle import LifecycleFact
from shardyard.scheduler.book import SchedulerBook


class SchedulerHandlers:
    def __init__(self, book: SchedulerBook, bus: Bus, clock: Clock) -> None:
        self.book = book
        self.bus = bus
        self.clock = clock

    async def on_lifecycle(self, event: LifecycleFact) -> None:
        now = self.clock.now()
        if isinstance(event, JobFailed):
            await self.bus.publish_all(self.book.revocations(event, now))
        if isinstance(event, JobCancelRequested):
            await self.bus.publish_all(self.book.on_cancel(event, now))
            return
        self.book.apply(event)
        if isinstance(event, JobReady | JobPreempted):
            await self.cycle()

    async def on_node_state(self, event: NodeState) -> None:
        self.book.apply(event)
        await self.cycle()

    async def on_shard_event(self, event: object) -> None:
        self.book.apply(event)
        await self.bus.publish_all(self.book.on_shard_event(self.clock.now()))
        await self.cycle()

    async def cycle(self) -> None:
        await self.bus.publish_all(self.book.cycle(self.clock.now()))
