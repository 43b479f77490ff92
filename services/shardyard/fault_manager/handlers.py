"""Fault-manager handlers: facts to the book and the redundancy tracker, what they decide to the bus.

Every replica follows every fact; a replica decides for the jobs of the shard-events partitions the consumer group
gives it, and the one holding partition 0 publishes the spare ratio."""

import logging
import time
from collections.abc import Mapping, Sequence

from shardyard import tracing
from shardyard.bus.kafka import Bus
from shardyard.bus.topics import FAILURES, NODE_STATE, REDUNDANCY, SHARD_EVENTS, Topic
from shardyard.clock import Clock
from shardyard.events import Event, JobFailed, JobRecovering
from shardyard.fault_manager.book import FaultBook
from shardyard.fault_manager.redundancy import RedundancyTracker

log = logging.getLogger(__name__)

DECISION_SPANS: Mapping[type[Event], str] = {JobRecovering: "recovery-plan", JobFailed: "completion"}
"""Each recovery plan, and the end of a job whose retries are spent, is a span of the job's trace."""

RATIO_PARTITION = 0
"""The replica that holds this shard-events partition publishes the spare ratio (every replica tracks it)."""


class FaultHandlers:
    def __init__(self, book: FaultBook, redundancy: RedundancyTracker, bus: Bus, clock: Clock) -> None:
        self.book = book
        self.redundancy = redundancy
        self.bus = bus
        self.clock = clock
        self.live = False
        """Whether followed facts are current (decide on them) or the log being caught up with."""

    async def on_followed(self, topic: Topic, event: object) -> None:
        if topic is not REDUNDANCY:
            self.book.apply(event)
        if topic in (REDUNDANCY, SHARD_EVENTS):
            self.redundancy.apply(event)
        if self.live and topic in (SHARD_EVENTS, NODE_STATE, FAILURES):
            await self.decide()

    async def own(self, partitions: frozenset[int]) -> None:
        """The shard-events partitions whose jobs this replica decides from now on."""
        self.book.owned = partitions

    async def on_owned(self, _events: Sequence[object]) -> list[Event]:
        """The group's subscription only tells this replica which partitions it owns (and dead-letters what does not
        decode); the facts come followed. Read a batch at a time, it costs one commit a batch."""
        return []

    async def decide(self) -> None:
        started = time.time_ns()
        await tracing.publish_spanned(self.bus, self.book.decide(self.clock.now()), DECISION_SPANS, start_time=started)

    async def tick(self) -> None:
        """Decisions that came due with time (the COMM_ERROR grace), and the redundancy ratio as the window moves."""
        now, started = self.clock.now(), time.time_ns()
        await tracing.publish_spanned(self.bus, self.book.decide(now), DECISION_SPANS, start_time=started)
        if self.book.owned is not None and RATIO_PARTITION not in self.book.owned:
            self.redundancy.window.prune(now)  # another replica publishes the ratio; this one follows it
            return
        change = self.redundancy.check(now)
        if change is not None:
            await self.bus.publish(change)
