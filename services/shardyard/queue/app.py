"""Wiring of the queue service: the only place that connects its book to the bus."""

from faststream import FastStream
from pydantic import Field

from shardyard.bus.admin import ensure_topics
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.replay import replay
from shardyard.bus.topics import LIFECYCLE, SUBMISSIONS
from shardyard.clock import Clock
from shardyard.gpus import catalogue_with
from shardyard.queue.book import QueueBook
from shardyard.queue.handlers import QueueHandlers
from shardyard.service import announce
from shardyard.settings import GpuFigures, ReplicatedSettings

SERVICE = "queue"


class QueueSettings(ReplicatedSettings):
    """The queue: admission and ordering of submitted jobs."""

    gpu_tflops: GpuFigures = Field(default_factory=list, description="catalogue overrides, MODEL=TFLOPS")


def build_app(settings: QueueSettings, *, clock: Clock) -> FastStream:
    broker = make_broker(settings.bootstrap, client_id=f"{SERVICE}-{settings.instance}")
    bus = Bus(broker, service=SERVICE)
    book = QueueBook(catalogue_with(settings.gpu_tflops))
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
        # Publishing needs the started broker, hence here and not right after the replay. ``reconcile`` decides
        # synchronously, so a lifecycle message handled meanwhile cannot make it decide the same thing twice.
        await handlers.reconcile()
        await announce(bus, clock, instance=settings.instance)

    return app
