"""Resource-pool handlers: heartbeats and drain requests in (for the nodes this replica owns), node state out; every
replica follows the ledger (assignments, shard ends, job ends) and the other replicas' node states."""

import logging
from collections.abc import Callable, Sequence

from shardyard.bus.kafka import Bus
from shardyard.bus.topics import Topic
from shardyard.clock import Clock
from shardyard.events import Event, Heartbeat, NodeDrain, NodeLease, NodeLeases, NodeState
from shardyard.metrics import POOL_BEATS
from shardyard.resource_pool.book import PoolBook

log = logging.getLogger(__name__)


class PoolHandlers:
    def __init__(self, book: PoolBook, bus: Bus, clock: Clock, reach: Callable[[], bool] = lambda: True) -> None:
        self.book = book
        self.bus = bus
        self.clock = clock
        self.reach = reach
        """Whether this replica reaches the broker now (``bus.reach``): while it does not, silence judges nothing."""
        self.live = False
        self._changed: set[str] = set()
        """Nodes whose reservations the batch being followed changed."""
        """Whether followed events are current (publish what they change) or the log being caught up with."""

    async def on_heartbeats(self, events: Sequence[Heartbeat | NodeLease | NodeLeases | NodeDrain]) -> list[Event]:
        """A batch of the heartbeats topic: agents' full heartbeats and leases, relays' leases, and operators' drain
        requests.
        Returns the node states they change (the bus publishes them, then commits the batch)."""
        now = self.clock.now()
        out: list[Event] = []
        for event in events:
            match event:
                case NodeDrain():
                    out.extend(self.book.on_drain(event, now))
                case NodeLease():
                    POOL_BEATS.labels("lease").inc()
                    out.extend(self.book.on_lease(event, now))
                case NodeLeases():
                    POOL_BEATS.labels("relayed").inc(len(event.leases))
                    out.extend(self.book.on_leases(event, now))
                case Heartbeat():
                    POOL_BEATS.labels("heartbeat").inc()
                    out.extend(self.book.on_heartbeat(event, now))
        return out

    async def on_followed(self, _topic: Topic, event: object) -> None:
        """Every replica's view of the whole pool: other replicas' node states, and the reservations ledger. The
        states of the nodes whose reservations changed go out once the batch is read (``flush``)."""
        if isinstance(event, NodeState):
            self.book.observe(event)
            return
        changed = self.book.apply_ledger(event)
        if self.live:
            self._changed.update(changed)

    async def flush(self) -> None:
        """The follower handed over a batch: publish each changed node's state once, all in one go."""
        changed, self._changed = self._changed, set()
        if changed:
            await self.bus.publish_all(self.book.states_of(changed, self.clock.now()))

    async def own(self, partitions: frozenset[int]) -> None:
        """The heartbeats partitions whose nodes this replica judges from now on."""
        self.book.assign(partitions, self.clock.now())

    async def tick(self) -> None:
        await self.bus.publish_all(self.book.tick(self.clock.now(), blind=not self.reach()))
