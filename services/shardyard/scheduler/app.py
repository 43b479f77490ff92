"""Wiring of the scheduler service."""

from faststream import FastStream

from shardyard.bus.admin import ensure_topics
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.replay import replay
from shardyard.bus.topics import LIFECYCLE, NODE_STATE, SHARD_EVENTS
from shardyard.clock import Clock
from shardyard.scheduler.book import SchedulerBook
from shardyard.scheduler.handlers import SchedulerHandlers
from shardyard.service import Periodic, announce
from shardyard.settings import ServiceSettings

SERVICE = "scheduler"


class SchedulerSettings(ServiceSettings):
    """The scheduler: gang placement of ready jobs on nodes."""

    checkpoint_root: str = "/data/checkpoints"
    cycle_interval_s: float = 1.0


def build_app(settings: SchedulerSettings, *, clock: Clock) -> FastStream:
    broker = make_broker(settings.bootstrap, client_id=f"{SERVICE}-{settings.instance}")
    bus = Bus(broker, service=SERVICE)
    book = SchedulerBook(checkpoint_root=settings.checkpoint_root)
    handlers = SchedulerHandlers(book, bus, clock)
    group = "shardyard-scheduler"
    bus.subscribe({NODE_STATE: handlers.on_node_state}, group=None)
    bus.subscribe({LIFECYCLE: handlers.on_lifecycle, SHARD_EVENTS: handlers.on_shard_event}, group=group)
    ticker = Periodic("scheduler-cycle", settings.cycle_interval_s, handlers.cycle)
    app = FastStream(broker)

    @app.on_startup
    async def rebuild() -> None:
        await ensure_topics(settings.bootstrap)
        await replay(settings.bootstrap, [LIFECYCLE, SHARD_EVENTS, NODE_STATE], lambda _t, event: book.apply(event))

    @app.after_startup
    async def ready() -> None:
        ticker.start()
        await announce(bus, clock, instance=settings.instance)

    @app.on_shutdown
    async def stop() -> None:
        await ticker.stop()

    return app
