"""Wiring of the resource-pool service."""

from faststream import FastStream
from pydantic import Field

from shardyard.bus.reach import BrokerReach
from shardyard.bus.topics import ASSIGNMENTS, HEARTBEATS, LIFECYCLE, NODE_STATE, SHARD_EVENTS
from shardyard.clock import Clock
from shardyard.resource_pool.book import STATE_REFRESH_S, PoolBook
from shardyard.resource_pool.handlers import PoolHandlers
from shardyard.resource_pool.ledger import Ledger
from shardyard.resource_pool.telemetry import Tolerance
from shardyard.service import Follow, Periodic, Split, partitioned_app, replica_bus
from shardyard.settings import ReplicatedSettings

SERVICE = "resource-pool"
GROUP = "shardyard-resource-pool"
PAUSE_TICKS = 10
"""A replica whose ticks were this many intervals apart (at least 1 s) was not running: it judges no silence then."""


UNREAD = frozenset(
    {
        "job.accepted",
        "job.rejected",
        "job.ready",
        "job.unschedulable",
        "job.waiting",
        "job.preempting",
        "job.running",
        "job.cancel_requested",
        "shard.started",
        "shard.progress",
        "shard.checkpointed",
        "shard.stop_request",
    }
)
"""Followed facts the pool never applies (its ledger, ``Ledger.apply``, and other replicas' node states): passed over
undecoded."""


class PoolSettings(ReplicatedSettings):
    """The resource pool: node inventory, liveness and reservations. Replicas split the nodes between them."""

    suspect_after_s: float = 3.0
    lost_after_s: float = 10.0
    tick_interval_s: float = 0.1
    """How often silences are checked: a node turns SUSPECT between this long before its 3 s of silence end and
    their end."""
    state_refresh_s: float = Field(
        default=STATE_REFRESH_S, gt=0, description="republish an unchanged node's state this often"
    )
    load_step: float = Field(default=0.05, gt=0, description="CPU load change that republishes a node's state")
    start_deadline_s: float = Field(
        default=60.0, gt=0, description="the scheduler's start deadline: no reservation is orphaned within it"
    )
    reservation_grace_s: float = Field(
        default=30.0,
        gt=0,
        description="past the start deadline, release a training shard's reservation its node's full heartbeats "
        "have left out this long (agents send one on change and every 10 s)",
    )


def build_app(settings: PoolSettings, *, clock: Clock) -> FastStream:
    """Every replica follows the ledger and the node states; the consumer group on the heartbeats topic splits the
    nodes between the replicas, and a replica judges and publishes the nodes of its partitions only. When one dies,
    the group gives its partitions to the others within its session timeout."""
    bus = replica_bus(SERVICE, settings)
    book = PoolBook(
        suspect_after_s=settings.suspect_after_s,
        lost_after_s=settings.lost_after_s,
        check_every_s=settings.tick_interval_s,
        owned=frozenset(),  # until the group gives this replica partitions
        pause_after_s=max(1.0, PAUSE_TICKS * settings.tick_interval_s),
        refresh_s=settings.state_refresh_s,
        tolerance=Tolerance(load=settings.load_step),
        ledger=Ledger(start_deadline_s=settings.start_deadline_s, grace_s=settings.reservation_grace_s),
    )
    reach = BrokerReach(settings.bootstrap, name=f"{SERVICE}-{settings.instance}")
    handlers = PoolHandlers(book, bus, clock, reach.reachable)
    follow = Follow(
        [NODE_STATE, ASSIGNMENTS, SHARD_EVENTS, LIFECYCLE],
        handlers.on_followed,
        after_batch=handlers.flush,
        unread=UNREAD,
    )
    # A dead replica's nodes are judged again within one election's time. Partitions given are judged at once: the
    # follower is not waited on.
    split = Split(
        HEARTBEATS,
        GROUP,
        handlers.own,
        lambda: book.owned,
        who=f"resource pool {settings.instance} judges the nodes",
        routes={HEARTBEATS: handlers.on_heartbeats},
        after_catching_up=False,
    )

    def live() -> None:
        handlers.live = True

    app = partitioned_app(
        bus,
        settings,
        clock,
        follow=follow,
        split=split,
        ticker=Periodic("liveness", settings.tick_interval_s, handlers.tick),
        on_caught_up=live,  # the whole pool as the log has it, before any heartbeat is judged
    )
    app.on_startup(reach.start)
    app.on_shutdown(reach.stop)
    return app
