"""Wiring of the monitor: every topic into the view; the view out over HTTP; alert transitions out to the alerts
topic."""

from dataclasses import fields
from typing import cast

from aiohttp import web
from faststream import FastStream
from pydantic import Field

from shardyard.bus.admin import ensure_topics
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.topics import (
    ALERTS,
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
from shardyard.metrics import ConsumerLag, Subscription
from shardyard.monitor.alerts import AlertBook, AlertPolicy, CatchUp
from shardyard.monitor.handlers import MonitorHandlers
from shardyard.monitor.http import build_http
from shardyard.monitor.metrics import make_registry
from shardyard.monitor.views import ClusterView
from shardyard.service import Periodic, announce
from shardyard.settings import ServiceSettings

SERVICE = "monitor"
RULES = AlertPolicy()
"""The rules' default thresholds, for the settings' defaults."""


class MonitorSettings(ServiceSettings):
    """The monitor: metrics, the status API."""

    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8787, ge=0, lt=65536)
    alert_interval_s: float = Field(default=0.5, gt=0, le=60, description="how often the alert rules are judged (s)")
    lag_interval_s: float = Field(default=1.0, gt=0, le=60, description="how often this replica measures its lag (s)")
    alert_resource_shortage_s: float = Field(
        default=RULES.resource_shortage_s, ge=0, description="RESOURCE_SHORTAGE: a job waited for capacity this long"
    )
    alert_sync_timeout_window_s: float = Field(
        default=RULES.sync_timeout_window_s, gt=0, description="SYNC_TIMEOUT: fires this long after a sync timeout"
    )
    alert_slow_sync_ratio: float = Field(
        default=RULES.slow_sync_ratio, gt=1, description="SLOW_SYNC: observed / asked sync interval at least this"
    )
    alert_gpu_temperature_c: float = Field(
        default=RULES.gpu_temperature_c, description="GPU_OVER_TEMPERATURE: a GPU hotter than this (Celsius)"
    )
    alert_gpu_temperature_for_s: float = Field(
        default=RULES.gpu_temperature_for_s, ge=0, description="GPU_OVER_TEMPERATURE: for this long"
    )
    alert_heartbeat_lag_s: float = Field(
        default=RULES.heartbeat_lag_s, gt=0, description="HEARTBEAT_LAG: newest heartbeat older, or later, than this"
    )
    alert_consumer_lag_messages: int = Field(
        default=RULES.consumer_lag_messages, ge=0, description="CONSUMER_LAG: this replica more messages behind"
    )
    alert_consumer_lag_for_s: float = Field(
        default=RULES.consumer_lag_for_s, ge=0, description="CONSUMER_LAG: for this long"
    )
    alert_no_progress_s: float = Field(
        default=RULES.no_progress_s, gt=0, description="NO_PROGRESS: a running job reported no step for this long"
    )

    def alert_policy(self) -> AlertPolicy:
        """The rules' thresholds: each ``AlertPolicy`` field from the setting ``alert_<field>``."""
        limits = {f.name: getattr(self, f"alert_{f.name}") for f in fields(AlertPolicy) if f.name != "instance"}
        return AlertPolicy(instance=self.instance, **limits)


def build_app(settings: MonitorSettings, *, clock: Clock) -> FastStream:
    broker = make_broker(settings.bootstrap, client_id=f"{SERVICE}-{settings.instance}")
    bus = Bus(broker, service=SERVICE)
    view = ClusterView()
    registry, events = make_registry(view)
    handlers = MonitorHandlers(view, events)
    # No consumer group: every monitor replica reads every topic from the beginning and so rebuilds its view.
    watched = (
        LIFECYCLE,
        SHARD_EVENTS,
        NODE_STATE,
        FAILURES,
        SERVICES,
        ASSIGNMENTS,
        HEARTBEATS,
        REDUNDANCY,
        ELASTICITY,
        ALERTS,
    )
    bus.subscribe(
        {topic: handlers.for_topic(topic) for topic in watched},
        raw_routes={DEADLETTER: handlers.on_dead_letter},
        group=None,
    )
    # Alerts: judged on this replica's view, published to the alerts topic, shown from it (see monitor/alerts.py).
    book, catch_up, lag = AlertBook(settings.alert_policy()), CatchUp(started_at=clock.monotonic()), ConsumerLag()
    for subscriber in broker.subscribers:
        lag.track(cast(Subscription, subscriber), group=None)

    async def measure_lag() -> None:
        measured: dict[str, int] = {}
        for (topic, _group), behind in (await lag.sample()).items():
            measured[topic] = measured.get(topic, 0) + behind
        view.consumer_lag = measured

    async def judge_alerts() -> None:
        every_topic = {topic.name for topic in watched} <= set(view.consumer_lag)
        if catch_up.observe(view.consumer_lag if every_topic else None, clock.monotonic()):
            await bus.publish_all(book.evaluate(view, clock.now()))

    tasks = (
        Periodic("consumer-lag", settings.lag_interval_s, measure_lag),
        Periodic("alerts", settings.alert_interval_s, judge_alerts),
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
        for task in tasks:
            task.start()

    @app.on_shutdown
    async def stop() -> None:
        for task in tasks:
            await task.stop()
        await runner.cleanup()

    return app
