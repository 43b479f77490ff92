"""Scheduler handlers: apply each fact to the book and, on the leader only, publish what the book decides.

Every replica follows the same topics and applies every fact (a standby is warm: its book is the leader's, read
from the log). Only the leader decides, and only while its lease holds for the term it decided under: a decision it
could not publish leaves its book ahead of the log, so the replica rebuilds its book from the log before it may lead
again. A placement the book fences (a deposed leader's, landing late) asks for a cycle, which revokes what it
assigned.

Cycles are coalesced: a burst of node states (10,000 nodes heartbeat every second) asks for one cycle, not one per
message. The periodic tick also reports elasticity signals.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from shardyard import tracing
from shardyard.bus.kafka import Bus
from shardyard.bus.topics import LIFECYCLE, LINKS, NODE_STATE, QUEUES, REDUNDANCY, SHARD_EVENTS, Topic
from shardyard.clock import Clock
from shardyard.events import (
    Event,
    JobCancelRequested,
    JobFailed,
    JobPreempted,
    JobReady,
    JobRecovering,
    JobScheduled,
    JobSucceeded,
    NodeState,
    RedundancyChanged,
)
from shardyard.lifecycle import LifecycleFact
from shardyard.metrics import observe_cycle
from shardyard.scheduler.book import SchedulerBook

log = logging.getLogger(__name__)

PLACEMENT_SPANS: Mapping[type[Event], str] = {JobScheduled: "placement"}
"""A gang's placement decision is one span of its job's trace (from the cycle's start to its publication)."""
COMPLETION_SPANS: Mapping[type[Event], str] = {JobSucceeded: "completion"}


async def _always(_term: int) -> bool:
    return True


class SchedulerHandlers:
    def __init__(
        self,
        book: SchedulerBook,
        bus: Bus,
        clock: Clock,
        *,
        confirm: Callable[[int], Awaitable[bool]] = _always,
        on_diverged: Callable[[], None] = lambda: None,
    ) -> None:
        self.book = book
        self.bus = bus
        self.clock = clock
        self.leading = False
        """Whether this replica decides: it was elected and its book has caught up with the log."""
        self._confirm = confirm
        """Whether this replica still leads under the given term (its lease holds)."""
        self._on_diverged = on_diverged
        self._wanted = False
        self._runner: asyncio.Task[None] | None = None
        self._touched: dict[str, None] = {}
        """Jobs whose shard facts came in the batch the follower is handing over (in order)."""

    async def handle(self, topic: Topic, event: object) -> None:
        """The follower's entry point: one fact of one of the followed topics."""
        if topic is LIFECYCLE:
            await self.on_lifecycle(event)  # type: ignore[arg-type]
        elif topic is SHARD_EVENTS:
            await self.on_shard_event(event)
        elif topic is NODE_STATE:
            await self.on_node_state(event)  # type: ignore[arg-type]
        elif topic is REDUNDANCY:
            await self.on_redundancy(event)  # type: ignore[arg-type]
        elif topic is LINKS:
            self.book.apply(event)  # measured RTTs: the next cycle places on them
        elif topic is QUEUES:
            self.book.apply(event)  # a new queues configuration: in force from the next cycle
            self.request_cycle()

    async def on_lifecycle(self, event: LifecycleFact) -> None:
        if not self.leading:
            self.book.apply(event)
            return
        now = self.clock.now()
        if isinstance(event, JobFailed):
            await self.publish(self.book.revocations(event, now))
        if isinstance(event, JobCancelRequested):
            await self.publish(self.book.on_cancel(event, now))
            return
        if isinstance(event, JobRecovering):
            attributes = tracing.event_attributes(event)
            with tracing.job_span("re-placement", event.job_id, attributes=attributes):
                await self.publish(self.book.on_recovering(event, now), spans=PLACEMENT_SPANS)
            self.request_cycle()
            return
        self.book.apply(event)
        if isinstance(event, JobReady | JobPreempted) or (isinstance(event, JobScheduled) and self.book.fence.stale):
            self.request_cycle()

    async def on_redundancy(self, event: RedundancyChanged) -> None:
        self.book.apply(event)
        log.info("spare ratio %.2f (failure rate %.3f)", event.ratio, event.failure_rate)

    async def on_node_state(self, event: NodeState) -> None:
        self.book.apply(event)
        self.request_cycle()

    async def on_shard_event(self, event: object) -> None:
        """A shard fact: its gang's consequences (RUNNING, SUCCEEDED, PREEMPTED) go out with the batch's (``flush``)."""
        self.book.apply(event)
        job_id = getattr(event, "job_id", None)
        if self.leading and job_id is not None:
            self._touched[job_id] = None

    async def flush(self) -> None:
        """The follower handed over a batch of facts: publish what its shard facts made of their gangs, at once (the
        gangs they were about, not every gang), and ask for one cycle (shards that ended freed their GPUs)."""
        jobs, self._touched = list(self._touched), {}
        if not jobs or not self.leading:
            return
        await self.publish(self.book.on_shard_event(self.clock.now(), jobs), spans=COMPLETION_SPANS)
        self.request_cycle()

    async def publish(
        self, events: Sequence[Event], *, spans: Mapping[type[Event], str] | None = None, started: int | None = None
    ) -> None:
        """Publish the leader's decisions, once its lease is confirmed. Decisions already applied to the book that
        cannot go out leave the book ahead of the log: the replica stops leading and rebuilds. ``spans`` names the
        decisions that are a span of their job's trace, begun at ``started`` (ns)."""
        if not events:
            return
        book, term = self.book, self.book.term  # what these were decided on and under, before any await
        if not self.leading or not await self._confirm(term) or not self.leading or self.book.term != term:
            if self.book is not book:
                return  # decided on a book the replica has since rebuilt: nothing of it is left to withhold
            log.warning("not leading under term %d: %d decided events withheld; rebuilding", term, len(events))
            self.leading = False
            self._on_diverged()
            return
        await tracing.publish_spanned(self.bus, events, spans or {}, start_time=started)

    async def take_over(self, term: int) -> None:
        """Start leading under ``term`` (the book has caught up with the log): carry out what the log says is due
        and was never published (a previous leader may have died between a fact and its consequence)."""
        self.book.term = term
        self.leading = True
        await self.publish(self.book.on_shard_event(self.clock.now()), spans=COMPLETION_SPANS)
        await self.cycle()

    def request_cycle(self) -> None:
        """Run a cycle soon; requests made while one runs fold into a single next cycle."""
        if not self.leading:
            return
        self._wanted = True
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run_cycles(), name="scheduler-cycles")

    async def _run_cycles(self) -> None:
        while self._wanted and self.leading:
            self._wanted = False
            await asyncio.sleep(0)  # let facts already delivered land before deciding
            try:
                await self.cycle()
            except Exception:
                log.exception("scheduling cycle failed; the next fact or tick retries")
                return

    async def cycle(self) -> None:
        if self.leading:
            started = time.time_ns()
            began = self.clock.monotonic()
            decided = self.book.cycle(self.clock.now())
            observe_cycle(self.clock.monotonic() - began, decided)  # the decision's own latency, not publishing's
            await self.publish(decided, spans=PLACEMENT_SPANS, started=started)

    async def tick(self) -> None:
        """The periodic cycle (time rules: aging, max_wait, preemption and start deadlines) and elasticity signals."""
        if not self.leading:
            return
        await self.cycle()
        await self.publish(self.book.elasticity_signals(self.clock.now()))

    async def drain(self) -> None:
        """Wait for a running cycle (shutdown)."""
        if self._runner is not None:
            await asyncio.gather(self._runner, return_exceptions=True)
