"""Fault-manager handlers: facts to the book and the redundancy tracker, what they decide to the bus."""

import time
from collections.abc import Mapping

from shardyard import tracing
from shardyard.bus.kafka import Bus
from shardyard.clock import Clock
from shardyard.events import Event, JobFailed, JobRecovering
from shardyard.fault_manager.book import FaultBook
from shardyard.fault_manager.redundancy import RedundancyTracker

DECISION_SPANS: Mapping[type[Event], str] = {JobRecovering: "recovery-plan", JobFailed: "completion"}
"""Each recovery plan, and the end of a job whose retries are spent, is a span of the job's trace."""


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
        started = time.time_ns()
        await tracing.publish_spanned(self.bus, self.book.decide(self.clock.now()), DECISION_SPANS, start_time=started)

    async def tick(self) -> None:
        """Decisions that came due with time (the COMM_ERROR grace), and the redundancy ratio as the window moves."""
        now, started = self.clock.now(), time.time_ns()
        await tracing.publish_spanned(self.bus, self.book.decide(now), DECISION_SPANS, start_time=started)
        change = self.redundancy.check(now)
        if change is not None:
            await self.bus.publish(change)
