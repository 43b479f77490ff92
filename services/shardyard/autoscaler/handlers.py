"""Autoscaler handlers: the followed facts to the book, one typed handler per topic; the book's decisions carried
out through the provider (off the event loop) and the bus (drains).

Facts are applied from the start of the log (capacity requests, reclaim candidates and node states are facts with
their times); decisions are taken only once the log is caught up (``live``), on each capacity signal and on every
tick. A provider that fails is logged and counted, and the book is told (a failed removal is retried after the
cooldown): the service never dies on it."""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from shardyard.autoscale.provider import NodeProvider, ProviderError
from shardyard.autoscaler import metrics
from shardyard.autoscaler.book import Action, Add, AutoscaleBook, Drain, Phase, Remove, Undrain
from shardyard.bus.kafka import Bus
from shardyard.bus.topics import ELASTICITY, NODE_STATE, Topic
from shardyard.clock import Clock
from shardyard.events import CapacityRequested, NodeDrain, NodeState, ReclaimCandidate

log = logging.getLogger(__name__)


class AutoscalerHandlers:
    def __init__(self, book: AutoscaleBook, provider: NodeProvider, bus: Bus, clock: Clock) -> None:
        self.book = book
        self.provider = provider
        self.bus = bus
        self.clock = clock
        self.live = False
        """Whether followed facts are current (decide on them) or the log being caught up with."""
        self._turn = asyncio.Lock()
        self.routes: Mapping[Topic, Callable[[Any], Awaitable[None]]] = {
            ELASTICITY: self.on_elasticity,
            NODE_STATE: self.on_node_state,
        }

    async def on_followed(self, topic: Topic, event: object) -> None:
        await self.routes[topic](event)

    async def on_elasticity(self, event: CapacityRequested | ReclaimCandidate) -> None:
        if isinstance(event, CapacityRequested):
            self.book.on_capacity(event)
        else:
            self.book.on_reclaim(event)
        if self.live:
            await self.act()

    async def on_node_state(self, state: NodeState) -> None:
        self.book.on_node_state(state)

    async def tick(self) -> None:
        if self.live:
            await self.act()

    async def act(self) -> None:
        """One turn: what the provider manages, the book's decisions, each carried out."""
        async with self._turn:
            for node in self.book.adopt(await asyncio.to_thread(self.provider.nodes)):
                log.warning("node %s (%s) is gone from the %s provider", node.node_id, node.phase, self.provider.name)
                if node.phase is Phase.JOINING:  # its agent died before it ever came ALIVE
                    metrics.ACTIONS.labels("join", "failed").inc()
            for action in self.book.decide(self.clock.now()):
                await self._carry_out(action)
            metrics.show_nodes(self.book.counts())

    async def _carry_out(self, action: Action) -> None:
        match action:
            case Add(gpu_model=model, gpus_per_node=gpus, count=count, jobs=jobs):
                try:
                    added = await asyncio.to_thread(self.provider.add, model, gpus, count)
                except ProviderError as exc:
                    log.error("adding %d x %s:%d node(s) failed: %s", count, model, gpus, exc)
                    metrics.ACTIONS.labels("add", "failed").inc()
                    return
                self.book.on_added(added, model, gpus, self.clock.now())
                metrics.ACTIONS.labels("add", "ok").inc(len(added))
                log.info("adding %s (%s:%d each) for %s", ", ".join(added), model, gpus, ", ".join(jobs))
            case Drain(node_id=node_id):
                await self._drain(node_id, draining=True)
            case Undrain(node_id=node_id):
                log.info("keeping %s: demand for its model returned while it drained", node_id)
                await self._drain(node_id, draining=False)
            case Remove(node_id=node_id, reason=reason):
                try:
                    await asyncio.to_thread(self.provider.remove, node_id)
                except ProviderError as exc:
                    log.error("removing %s (%s) failed: %s", node_id, reason, exc)
                    metrics.ACTIONS.labels("remove", "failed").inc()
                    self.book.on_remove_failed(node_id, self.clock.now())
                    return
                self.book.on_removed(node_id)
                metrics.ACTIONS.labels("remove", "ok").inc()
                log.info("removed %s (%s)", node_id, reason)
                # A node of that name added later must not come back drained (the pool keeps the mark by name).
                await self._drain(node_id, draining=False)

    async def _drain(self, node_id: str, *, draining: bool) -> None:
        try:
            await self.bus.publish(NodeDrain(occurred_at=self.clock.now(), node_id=node_id, draining=draining))
        except Exception as exc:  # the broker busy or away: the book sends a drain again after drain_retry_s
            log.error("publishing the %s of %s failed: %r", "drain" if draining else "undrain", node_id, exc)
            metrics.ACTIONS.labels("drain", "failed").inc()
            return
        if draining:
            metrics.ACTIONS.labels("drain", "ok").inc()
            log.info("draining %s: it is removed once idle", node_id)
