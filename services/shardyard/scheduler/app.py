"""Wiring of the scheduler service."""

from faststream import FastStream
from pydantic import Field

from shardyard.bus.admin import ensure_topics
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.replay import replay
from shardyard.bus.topics import LIFECYCLE, NODE_STATE, REDUNDANCY, SHARD_EVENTS
from shardyard.clock import Clock
from shardyard.scheduler.book import SchedulerBook
from shardyard.scheduler.elasticity import ElasticityTracker
from shardyard.scheduler.handlers import SchedulerHandlers
from shardyard.scheduler.model import Policy
from shardyard.service import Periodic, announce
from shardyard.settings import ServiceSettings

SERVICE = "scheduler"


class SchedulerSettings(ServiceSettings):
    """The scheduler: gang placement of ready jobs on nodes."""

    checkpoint_root: str = "/data/checkpoints"
    cycle_interval_s: float = Field(default=1.0, gt=0)
    load_threshold: float = Field(default=0.5, gt=0, description="nodes at or above this CPU load take no shards")
    aging_per_minute: float = Field(default=1.0, ge=0, description="priority a pending job gains per minute waited")
    reservations: int = Field(default=1, ge=0, description="blocked jobs that hold a reservation against backfill")
    preemption: bool = Field(default=True, description="preempt lower-priority preemptible jobs to fit higher ones")
    preempt_deadline_s: float = Field(default=30.0, gt=0, description="revoke a preempted gang after this long")
    spare_grace_s: float = Field(default=2.0, ge=0, description="how long a new gang waits for room for its spares")
    capacity_repeat_s: float = Field(default=30.0, gt=0, description="repeat an unchanged capacity request after")
    reclaim_after_s: float = Field(default=300.0, gt=0, description="idle time before a node is a reclaim candidate")

    def policy(self) -> Policy:
        return Policy(
            load_threshold=self.load_threshold,
            aging_per_minute=self.aging_per_minute,
            reservations=self.reservations,
            preemption=self.preemption,
        )


def build_app(settings: SchedulerSettings, *, clock: Clock) -> FastStream:
    broker = make_broker(settings.bootstrap, client_id=f"{SERVICE}-{settings.instance}")
    bus = Bus(broker, service=SERVICE)
    book = SchedulerBook(
        checkpoint_root=settings.checkpoint_root,
        policy=settings.policy(),
        preempt_deadline_s=settings.preempt_deadline_s,
        spare_grace_s=settings.spare_grace_s,
        elasticity=ElasticityTracker(repeat_s=settings.capacity_repeat_s, reclaim_after_s=settings.reclaim_after_s),
    )
    handlers = SchedulerHandlers(book, bus, clock)
    group = "shardyard-scheduler"
    bus.subscribe({NODE_STATE: handlers.on_node_state, REDUNDANCY: handlers.on_redundancy}, group=None)
    bus.subscribe({LIFECYCLE: handlers.on_lifecycle, SHARD_EVENTS: handlers.on_shard_event}, group=group)
    ticker = Periodic("scheduler-cycle", settings.cycle_interval_s, handlers.tick)
    app = FastStream(broker)

    @app.on_startup
    async def rebuild() -> None:
        await ensure_topics(settings.bootstrap)
        await replay(
            settings.bootstrap, [LIFECYCLE, SHARD_EVENTS, NODE_STATE, REDUNDANCY], lambda _t, event: book.apply(event)
        )

    @app.after_startup
    async def ready() -> None:
        ticker.start()
        await announce(bus, clock, instance=settings.instance)

    @app.on_shutdown
    async def stop() -> None:
        await ticker.stop()
        await handlers.drain()

    return app
