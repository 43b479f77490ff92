"""Wiring of the fault-manager service."""

from faststream import FastStream

from shardyard.bus.admin import ensure_topics
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.replay import replay
from shardyard.bus.topics import ASSIGNMENTS, FAILURES, LIFECYCLE, SHARD_EVENTS
from shardyard.clock import Clock
from shardyard.fault_manager.book import FaultBook
from shardyard.fault_manager.handlers import FaultHandlers
from shardyard.service import announce
from shardyard.settings import ServiceSettings

SERVICE = "fault-manager"


class FaultSettings(ServiceSettings):
    """The fault manager: shard failures and node losses become job decisions."""


def build_app(settings: FaultSettings, *, clock: Clock) -> FastStream:
    broker = make_broker(settings.bootstrap, client_id=f"{SERVICE}-{settings.instance}")
    bus = Bus(broker, service=SERVICE)
    book = FaultBook()
    handlers = FaultHandlers(book, bus, clock)
    group = "shardyard-fault-manager"
    bus.subscribe(
        {
            LIFECYCLE: handlers.on_fact,
            ASSIGNMENTS: handlers.on_fact,
            SHARD_EVENTS: handlers.on_shard_event,
            FAILURES: handlers.on_failure,
        },
        group=group,
    )
    app = FastStream(broker)

    @app.on_startup
    async def rebuild() -> None:
        await ensure_topics(settings.bootstrap)
        await replay(settings.bootstrap, [LIFECYCLE, ASSIGNMENTS], lambda _t, event: book.apply(event))

    @app.after_startup
    async def ready() -> None:
        await announce(bus, clock, instance=settings.instance)

    return app
