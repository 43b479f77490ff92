"""Wiring of the queue service: the only place that connects its book to the bus."""

from collections.abc import Mapping

from faststream import FastStream

from shardyard.bus.admin import ensure_topics
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.replay import replay
from shardyard.bus.topics import LIFECYCLE, SUBMISSIONS
from shardyard.clock import Clock
from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.queue.book import QueueBook
from shardyard.queue.handlers import QueueHandlers
from shardyard.service import announce
from shardyard.settings import ServiceSettings

SERVICE = "queue"


class QueueSettings(ServiceSettings):
    """The queue: admission and ordering of submitted jobs."""


def build_app(settings: QueueSettings, *, clock: Clock, catalogue: Mapping[str, float] = DEFAULT_TFLOPS) -> FastStream:
    broker = make_broker(settings.bootstrap, client_id=f"{SERVICE}-{settings.instance}")
    bus = Bus(broker, service=SERVICE)
    book = QueueBook(catalogue)
    handlers = QueueHandlers(book, bus, clock)
    # Lifecycle facts are read by every replica in full (no group): each needs the whole job table.
    bus.subscribe({LIFECYCLE: handlers.on_lifecycle}, group=None)
    bus.subscribe({}, raw_routes={SUBMISSIONS: handlers.on_submission}, group="shardyard-queue")
    app = FastStream(broker)

    @app.on_startup
    async def rebuild() -> None:
        await ensure_topics(settings.bootstrap)
        await replay(settings.bootstrap, [LIFECYCLE], lambda _topic, event: book.apply(event))

    @app.after_startup
    async def ready() -> None:
        await announce(bus, clock, instance=settings.instance)

    return app
