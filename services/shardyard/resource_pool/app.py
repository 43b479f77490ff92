"""Wiring of the resource-pool service."""

from faststream import FastStream

from shardyard.bus.admin import ensure_topics
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.replay import replay
from shardyard.bus.topics import ASSIGNMENTS, HEARTBEATS, LIFECYCLE, NODE_STATE, SHARD_EVENTS, Topic
from shardyard.clock import Clock
from shardyard.events import NodeState
from shardyard.resource_pool.book import PoolBook
from shardyard.resource_pool.handlers import PoolHandlers
from shardyard.service import Periodic, announce
from shardyard.settings import ReplicatedSettings

SERVICE = "resource-pool"


class PoolSettings(ReplicatedSettings):
    """The resource pool: node inventory, liveness and reservations."""

    suspect_after_s: float = 3.0
    lost_after_s: float = 10.0
    tick_interval_s: float = 0.1
    """How often silences are checked: a node turns SUSPECT between this long before its 3 s of silence end and
    their end."""


def build_app(settings: PoolSettings, *, clock: Clock) -> FastStream:
    broker = make_broker(settings.bootstrap, client_id=f"{SERVICE}-{settings.instance}")
    bus = Bus(broker, service=SERVICE)
    book = PoolBook(
        suspect_after_s=settings.suspect_after_s,
        lost_after_s=settings.lost_after_s,
        check_every_s=settings.tick_interval_s,
    )
    handlers = PoolHandlers(book, bus, clock)
    bus.subscribe(
        {
            HEARTBEATS: handlers.on_heartbeat,
            ASSIGNMENTS: handlers.on_ledger_event,
            SHARD_EVENTS: handlers.on_ledger_event,
            LIFECYCLE: handlers.on_ledger_event,
        },
        group="shardyard-resource-pool",
    )
    ticker = Periodic("liveness", settings.tick_interval_s, handlers.tick)
    app = FastStream(broker)

    def restore(_topic: Topic, event: object) -> None:
        if isinstance(event, NodeState):
            book.restore(event)
        else:
            book.on_ledger_event(event)

    @app.on_startup
    async def rebuild() -> None:
        await ensure_topics(settings.bootstrap)
        await replay(settings.bootstrap, [NODE_STATE, ASSIGNMENTS, SHARD_EVENTS, LIFECYCLE], restore)

    @app.after_startup
    async def ready() -> None:
        ticker.start()
        await announce(bus, clock, instance=settings.instance)

    @app.on_shutdown
    async def stop() -> None:
        await ticker.stop()

    return app
