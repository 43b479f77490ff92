"""Wiring of the monitor: every topic into the view; the view out over HTTP."""

from aiohttp import web
from faststream import FastStream
from pydantic import Field

from shardyard.bus.admin import ensure_topics
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.topics import (
    ASSIGNMENTS,
    DEADLETTER,
    ELASTICITY,
    FAILURES,
    HEARTBEATS,
    LIFECYCLE,
    NODE_STATE,
    REDUNDANCY,
    SERVICES,
    SHARD_EVENTS,
)
from shardyard.clock import Clock
from shardyard.monitor.handlers import MonitorHandlers
from shardyard.monitor.http import build_http
from shardyard.monitor.metrics import make_registry
from shardyard.monitor.views import ClusterView
from shardyard.service import announce
from shardyard.settings import ServiceSettings

SERVICE = "monitor"


class MonitorSettings(ServiceSettings):
    """The monitor: metrics, the status API."""

    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8787, ge=0, lt=65536)


def build_app(settings: MonitorSettings, *, clock: Clock) -> FastStream:
    broker = make_broker(settings.bootstrap, client_id=f"{SERVICE}-{settings.instance}")
    bus = Bus(broker, service=SERVICE)
    view = ClusterView()
    registry, events = make_registry(view)
    handlers = MonitorHandlers(view, events)
    # No consumer group: every monitor replica reads every topic from the beginning and so rebuilds its view.
    watched = (LIFECYCLE, SHARD_EVENTS, NODE_STATE, FAILURES, SERVICES, ASSIGNMENTS, HEARTBEATS, REDUNDANCY, ELASTICITY)
    bus.subscribe(
        {topic: handlers.for_topic(topic) for topic in watched},
        raw_routes={DEADLETTER: handlers.on_dead_letter},
        group=None,
    )
    runner = web.AppRunner(build_http(view, registry), access_log=None)
    app = FastStream(broker)

    @app.on_startup
    async def topics() -> None:
        await ensure_topics(settings.bootstrap)

    @app.after_startup
    async def serve() -> None:
        await runner.setup()
        await web.TCPSite(runner, settings.http_host, settings.http_port).start()
        await announce(bus, clock, instance=settings.instance)

    @app.on_shutdown
    async def stop() -> None:
        await runner.cleanup()

    return app
