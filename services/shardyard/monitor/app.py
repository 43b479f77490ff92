"""Wiring of the monitor: every topic into the view (read in batches, see monitor/feed.py), the agents' link
measurements too; the view out over HTTP; alert transitions out to the alerts topic."""

import gc
import time
from dataclasses import fields
from pathlib import Path

from aiohttp import web
from faststream import FastStream
from pydantic import Field

from shardyard import metrics
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
    LINKS,
    NODE_STATE,
    QUEUES,
    REDUNDANCY,
    SERVICES,
    SHARD_EVENTS,
)
from shardyard.clock import Clock
from shardyard.links import SLOW_MIN_EXCESS_MS, SLOW_RATIO, LinkTable
from shardyard.metrics import ConsumerLag
from shardyard.monitor.access import TeamsFile, check_exposure
from shardyard.monitor.alerts import AlertBook, CatchUp
from shardyard.monitor.feed import Feed
from shardyard.monitor.handlers import MonitorHandlers
from shardyard.monitor.http import build_http
from shardyard.monitor.leadership import LeaderWatch
from shardyard.monitor.metrics import MonitorMetrics
from shardyard.monitor.network import Network
from shardyard.monitor.rules import AlertPolicy
from shardyard.monitor.telemetry import Telemetry
from shardyard.monitor.views import ClusterView
from shardyard.service import Periodic, announce
from shardyard.settings import ServiceSettings

SERVICE = "monitor"
RULES = AlertPolicy()
"""The rules' default thresholds, for the settings' defaults."""


class MonitorSettings(ServiceSettings):
    """The monitor: metrics, the status API."""

    dead_letter_share: str = Field(
        default="0/1",
        pattern=r"^\d+/[1-9]\d*$",
        description="THIS/MANY: this replica dead-letters the bad records of the partitions p mod MANY = THIS of the"
        " topics no service reads in a group (`up` gives each replica its share)",
    )

    http_host: str = Field(
        default="127.0.0.1", description="address the API and dashboard bind (another than loopback needs a token)"
    )
    http_port: int = Field(default=8787, ge=0, lt=65536)
    http_read_token: str | None = Field(
        default=None, min_length=16, description="the token every API request must carry (see monitor/access.py)"
    )
    credentials_file: Path | None = Field(
        default=None, description="the teams' keys: each team's token reads its own jobs' entrypoints only"
    )
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
    alert_dead_letter_window_s: float = Field(
        default=RULES.dead_letter_window_s, gt=0, description="DEAD_LETTERS: a topic's newest dead letter this recent"
    )
    alert_slow_link_for_s: float = Field(
        default=RULES.slow_link_for_s, ge=0, description="SLOW_LINK: a link judged slow for this long"
    )
    alert_disk_floor_bytes: int = Field(
        default=RULES.disk_floor_bytes, ge=0, description="DISK_FULL: a node's output disk has less free space"
    )
    alert_disk_full_window_s: float = Field(
        default=RULES.disk_full_window_s, gt=0, description="DISK_FULL: fires this long after a DISK_FULL failure"
    )
    alert_straggler_ratio: float = Field(
        default=RULES.straggler_ratio, gt=1, description="STRAGGLER: a rank's own time a step over the others' median"
    )
    alert_straggler_for_s: float = Field(default=RULES.straggler_for_s, ge=0, description="STRAGGLER: for this long")
    alert_straggler_said_s: float = Field(
        default=RULES.straggler_said_s, gt=0, description="STRAGGLER: fires at once, this long, on a rank judged slow"
    )
    alert_leader_proof_s: float = Field(
        default=RULES.leader_proof_s, gt=0, description="NO_LEADER, LEADERSHIP_HIJACKED: leadership unproven this long"
    )
    leadership_interval_s: float = Field(
        default=2.0, gt=0, description="ask the broker who holds each leader group's partition this often"
    )
    alert_node_alerts_grouped_over: int = Field(
        default=RULES.node_alerts_grouped_over,
        ge=0,
        description="NODE_SUSPECT, HEARTBEAT_LAG: more nodes than this at once make one alert on all nodes ('*')",
    )
    link_max_age_s: float = Field(
        default=LinkTable.max_age_s, gt=0, description="a link measurement older than this is stale (s)"
    )
    link_slow_ratio: float = Field(
        default=SLOW_RATIO, gt=1, description="a link is slow at this many times the cluster's baseline RTT"
    )
    link_slow_min_excess_ms: float = Field(
        default=SLOW_MIN_EXCESS_MS, ge=0, description="and at least this far above it (ms)"
    )
    accounting_url: str | None = Field(
        default=None, description="the job accounting database /api/history reads (sqlite:///PATH, postgresql://...)"
    )

    def alert_policy(self) -> AlertPolicy:
        """The rules' thresholds: each ``AlertPolicy`` field from the setting ``alert_<field>``."""
        limits = {f.name: getattr(self, f"alert_{f.name}") for f in fields(AlertPolicy) if f.name != "instance"}
        return AlertPolicy(instance=self.instance, **limits)

    def network(self) -> Network:
        """What the view keeps of the links topic, and when it calls a link stale or slow."""
        return Network(
            LinkTable(max_age_s=self.link_max_age_s),
            slow_ratio=self.link_slow_ratio,
            slow_min_excess_ms=self.link_slow_min_excess_ms,
        )


GC_YOUNG_THRESHOLD = 50_000
"""Net allocations between two collections of the youngest generation (Python's default: 700)."""


def tune_collector() -> None:
    """Fit the cycle collector to a process that folds thousands of events a second into a large, long-lived view.

    Nearly everything the monitor allocates (decoded events, the label sets of a scrape) is freed by reference
    counting, yet at the default threshold the collector ran some 12 times a second at 1,000 nodes, each pass over
    whatever was young then: a fifth of the monitor's CPU. Collecting the young every 50,000 net allocations makes it
    a pass every several seconds; freezing what start-up made (modules, classes, pydantic's validators) keeps the
    rare full collection off it. Cycles are still collected, later."""
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), middle, old)


WATCHED = (
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
    LINKS,
    QUEUES,
)
"""The topics the view folds (the feed reads the dead letters too). Alerts are judged only once this replica's lag
on every one of them is known."""


def build_app(settings: MonitorSettings, *, clock: Clock) -> FastStream:
    broker = make_broker(settings.bootstrap, client_id=f"{SERVICE}-{settings.instance}")
    bus = Bus(broker, service=SERVICE)
    view = ClusterView(telemetry=Telemetry(clock=clock), network=settings.network())
    exported = MonitorMetrics(view, clock)
    this, many = (int(part) for part in settings.dead_letter_share.split("/"))
    since_ms = int(time.time() * 1000)
    handlers = MonitorHandlers(view, exported.events, bus, bus.seal, share=(this % many, many), since_ms=since_ms)
    # No consumer group: every monitor replica reads every topic (heartbeats from their end) and so rebuilds its view.
    feed = Feed(
        settings.bootstrap,
        [*WATCHED, DEADLETTER],
        handlers.on_records,
        name=f"{SERVICE}-{settings.instance}",
        from_end=[HEARTBEATS],
    )
    leaders = LeaderWatch(settings.bootstrap, view, clock, name=f"{SERVICE}-{settings.instance}-leaders")
    tasks = _periodic_tasks(settings, view=view, feed=feed, bus=bus, clock=clock, leaders=leaders)
    check_exposure(settings.http_host, settings.http_read_token)
    http = build_http(
        view,
        exported,
        clock=clock,
        accounting_url=settings.accounting_url,
        read_token=settings.http_read_token,
        teams=TeamsFile(settings.credentials_file) if settings.credentials_file else None,
    )
    runner = web.AppRunner(http, access_log=None)
    app = FastStream(broker)

    @app.on_startup
    async def topics() -> None:
        await ensure_topics(settings.bootstrap)

    @app.after_startup
    async def serve() -> None:
        await feed.start()
        metrics.CONSUMER_LAG.ensure_sampling()
        await runner.setup()
        await web.TCPSite(runner, settings.http_host, settings.http_port).start()
        await announce(bus, clock, instance=settings.instance)
        for task in tasks:
            task.start()

    @app.on_shutdown
    async def stop() -> None:
        for task in tasks:
            await task.stop()
        await leaders.stop()
        await runner.cleanup()
        await feed.stop()

    return app


def _periodic_tasks(
    settings: MonitorSettings, *, view: ClusterView, feed: Feed, bus: Bus, clock: Clock, leaders: LeaderWatch
) -> tuple[Periodic, ...]:
    """The replica's periodic work: its consumer lag, measured into the view, and the alerts, judged on this
    replica's view once it has caught up, published to the alerts topic and shown from it (see monitor/alerts.py)."""
    book, catch_up, lag = AlertBook(settings.alert_policy()), CatchUp(started_at=clock.monotonic()), ConsumerLag()
    lag.track(feed, group=None)
    metrics.CONSUMER_LAG.track(feed, group=None)

    async def measure_lag() -> None:
        measured: dict[str, int] = {}
        for (topic, _group), behind in (await lag.sample()).items():
            measured[topic] = measured.get(topic, 0) + behind
        view.consumer_lag = measured

    async def judge_alerts() -> None:
        every_topic = {topic.name for topic in WATCHED} <= set(view.consumer_lag)
        if catch_up.observe(view.consumer_lag if every_topic else None, clock.monotonic()):
            await bus.publish_all(book.evaluate(view, clock.now()))

    return (
        Periodic("consumer-lag", settings.lag_interval_s, measure_lag),
        Periodic("leadership", settings.leadership_interval_s, leaders.tick),
        Periodic("alerts", settings.alert_interval_s, judge_alerts),
    )
