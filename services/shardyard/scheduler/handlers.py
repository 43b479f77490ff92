"""Scheduler handlers: apply each fact to the book, then publish what the book decides.

Facts are applied as they arrive; cycles are coalesced: a burst of node states (10,000 nodes heartbeat every
second) asks for one cycle, not one per message. The periodic tick also reports elasticity signals.
"""

import asyncio
import logging

from shardyard.bus.kafka import Bus
from shardyard.clock import Clock
from shardyard.events import (
    JobCancelRequested,
    JobFailed,
    JobPreempted,
    JobReady,
    JobRecovering,
    NodeState,
    RedundancyChanged,
)
from shardyard.lifecycle import LifecycleFact
from shardyard.scheduler.book import SchedulerBook

log = logging.getLogger(__name__)


class SchedulerHandlers:
    def __init__(self, book: SchedulerBook, bus: Bus, clock: Clock) -> None:
        self.book = book
        self.bus = bus
        self.clock = clock
        self._wanted = False
        self._runner: asyncio.Task[None] | None = None

    async def on_lifecycle(self, event: LifecycleFact) -> None:
        now = self.clock.now()
        if isinstance(event, JobFailed):
            await self.bus.publish_all(self.book.revocations(event, now))
        if isinstance(event, JobCancelRequested):
            await self.bus.publish_all(self.book.on_cancel(event, now))
            return
        if isinstance(event, JobRecovering):
            await self.bus.publish_all(self.book.on_recovering(event, now))
            self.request_cycle()
            return
        self.book.apply(event)
        if isinstance(event, JobReady | JobPreempted):
            self.request_cycle()

    async def on_redundancy(self, event: RedundancyChanged) -> None:
        self.book.apply(event)
        log.info("spare ratio %.2f (failure rate %.3f)", event.ratio, event.failure_rate)

    async def on_node_state(self, event: NodeState) -> None:
        self.book.apply(event)
        self.request_cycle()

    async def on_shard_event(self, event: object) -> None:
        self.book.apply(event)
        await self.bus.publish_all(self.book.on_shard_event(self.clock.now()))
        self.request_cycle()

    def request_cycle(self) -> None:
        """Run a cycle soon; requests made while one runs fold into a single next cycle."""
        self._wanted = True
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run_cycles(), name="scheduler-cycles")

    async def _run_cycles(self) -> None:
        while self._wanted:
            self._wanted = False
            await asyncio.sleep(0)  # let facts already delivered land before deciding
            try:
                await self.cycle()
            except Exception:
                log.exception("scheduling cycle failed; the next fact or tick retries")
                return

    async def cycle(self) -> None:
        await self.bus.publish_all(self.book.cycle(self.clock.now()))

    async def tick(self) -> None:
        """The periodic cycle (time-based rules: aging, max_wait, preemption deadlines) and elasticity signals."""
        await self.cycle()
        await self.bus.publish_all(self.book.elasticity_signals(self.clock.now()))

    async def drain(self) -> None:
        """Wait for a running cycle (shutdown)."""
        if self._runner is not None:
            await asyncio.gather(self._runner, return_exceptions=True)
