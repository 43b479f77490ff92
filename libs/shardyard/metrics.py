"""Process metrics: what every Shardyard process exposes on its own ``--metrics-port`` (0: off).

The monitor's ``/metrics`` describe the cluster, folded from every topic. These describe one process: the events it
consumed and published, how long its handlers took, how far its consumers trail their topics, and, in the
scheduler, how often and how fast it decides. Prometheus scrapes each process; the scrape job names the service.

Families, beside prometheus-client's default process, platform and GC collectors:

- ``shardyard_events_consumed_total{topic}``, ``shardyard_events_published_total{topic}``,
  ``shardyard_events_dead_lettered_total{topic}`` (by the topic the message came from)
- ``shardyard_queue_submissions_total{outcome,reason}`` (a queue's answers to submissions)
- ``shardyard_handler_seconds{topic}``: a histogram of decode plus handler time, retries included
- ``shardyard_consumer_lag_messages{topic, group}``: end offset minus position, summed over the partitions this
  process is assigned, sampled every ``LAG_INTERVAL_S`` (``group="none"`` for group-less subscriptions)
- ``shardyard_placement_decisions_total{kind}``, ``shardyard_placement_cycle_seconds``: the scheduler leader's
  published decisions (``place``, ``preempt``, ``unschedulable``) and the time of each ``SchedulerBook.cycle``

The metric objects live on prometheus-client's default registry, as module globals. That is the library's
convention: a process has one set of metrics. The bus layer that counts events is built inside every service's
wiring, and threading a registry through each service would change them all for nothing. Tests compare deltas.
"""

import asyncio
import logging
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol
from wsgiref.simple_server import WSGIServer

from aiokafka.errors import IllegalStateError, KafkaError
from prometheus_client import REGISTRY, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shardyard.errors import ConfigError
from shardyard.events import Event, JobPreempting, JobScheduled, JobUnschedulable

log = logging.getLogger(__name__)

LAG_INTERVAL_S = 5.0
"""How often consumer lag is sampled: one ListOffsets request per consumer, well below Prometheus's scrape rate."""
NO_GROUP = "none"

EVENTS_CONSUMED = Counter(
    "shardyard_events_consumed", "Messages this process consumed, decodable or not", labelnames=["topic"]
)
EVENTS_PUBLISHED = Counter("shardyard_events_published", "Events this process published", labelnames=["topic"])
EVENTS_REJECTED = Counter(
    "shardyard_events_rejected",
    "Events this process refused for their seal (shardyard.bus.seal): unsealed, a seal that does not verify, or a "
    "sealer that may not publish them, by topic and reason",
    labelnames=["topic", "reason"],
)
EVENTS_DEAD_LETTERED = Counter(
    "shardyard_events_dead_lettered",
    "Messages this process sent to the dead-letter topic, by the topic they came from",
    labelnames=["topic"],
)
SUBMISSIONS_ANSWERED = Counter(
    "shardyard_queue_submissions",
    "Submissions a queue replica answered, by outcome (accepted, rejected, forwarded to the job's partition, a "
    "redelivery answered before, or a team's cancel: cancel, cancel_refused) and rejection reason; dead-lettered ones "
    "are in shardyard_events_dead_lettered",
    labelnames=["outcome", "reason"],
)
POOL_BEATS = Counter(
    "shardyard_pool_beats",
    "Beats a resource-pool replica read, by kind: full heartbeats, leases alone, and leases relayed many to a record",
    labelnames=["kind"],
)
AGENT_LOOP_LAG = Histogram(
    "shardyard_agent_loop_lag_seconds",
    "How late a node agent's event loop woke for a 0.1 s sleep: its host's scheduling stalls (shardyard.liveness)",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0),
)
HANDLER_SECONDS = Histogram(
    "shardyard_handler_seconds",
    "Time to decode and handle one consumed message, retries included",
    labelnames=["topic"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
PLACEMENT_DECISIONS = Counter(
    "shardyard_placement_decisions",
    "Decisions the scheduler leader's cycles published, by kind (an unchanged unschedulable verdict is not repeated)",
    labelnames=["kind"],
)
PLACEMENT_CYCLE_SECONDS = Histogram(
    "shardyard_placement_cycle_seconds",
    "Time of one scheduling cycle: snapshot, placement of every pending job, decisions as events",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)

DECISION_KINDS: dict[type[Event], str] = {
    JobScheduled: "place",
    JobPreempting: "preempt",
    JobUnschedulable: "unschedulable",
}
for _kind in DECISION_KINDS.values():
    PLACEMENT_DECISIONS.labels(_kind)  # every kind is exported from 0, so rate() sees the first decision


@contextmanager
def handling(topic: str) -> Iterator[None]:
    """Count one consumed message of ``topic`` and time its handling (however it ends)."""
    EVENTS_CONSUMED.labels(topic).inc()
    with HANDLER_SECONDS.labels(topic).time():
        yield


def handled(topic: str, seconds: Sequence[float]) -> None:
    """Count a batch of consumed messages of ``topic`` with each one's handling time: ``handling`` for a reader that
    hands over batches, the label lookups done once a batch rather than once a message."""
    EVENTS_CONSUMED.labels(topic).inc(len(seconds))
    observe = HANDLER_SECONDS.labels(topic).observe
    for each in seconds:
        observe(each)


def observe_cycle(seconds: float, decided: Sequence[Event]) -> None:
    """Record one scheduling cycle: its duration and the decisions among the events it returned."""
    PLACEMENT_CYCLE_SECONDS.observe(seconds)
    for event in decided:
        kind = DECISION_KINDS.get(type(event))
        if kind is not None:
            PLACEMENT_DECISIONS.labels(kind).inc()


class LagSource(Protocol):
    """What lag sampling needs of a consumer (``aiokafka.AIOKafkaConsumer`` has it)."""

    def assignment(self) -> Iterable[Any]: ...

    async def end_offsets(self, partitions: list[Any]) -> dict[Any, int]: ...

    async def position(self, partition: Any) -> int: ...


class Subscription(Protocol):
    """A FastStream subscriber: its consumer exists only while the subscriber runs."""

    @property
    def consumer(self) -> Any: ...


class ConsumerLag(Collector):
    """Consumer lag of every subscription this process made, sampled in the process's event loop.

    Consumers are asyncio objects, and a scrape runs on the metrics server's thread. So a task samples them every
    ``interval_s`` and a scrape reports the last sample. Sampling starts with the first bus call inside a running
    event loop once ``serve_metrics`` enabled it, so no service's wiring has to remember it.
    """

    def __init__(self, interval_s: float = LAG_INTERVAL_S, position_timeout_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.position_timeout_s = position_timeout_s
        self.enabled = False
        self._subscriptions: list[tuple[Subscription, str]] = []
        self._lag: dict[tuple[str, str], int] = {}
        self._task: asyncio.Task[None] | None = None

    def track(self, subscription: Subscription, *, group: str | None) -> None:
        self._subscriptions.append((subscription, group or NO_GROUP))

    @property
    def groups(self) -> list[str]:
        """The group of each tracked subscription (``none`` for group-less ones), in the order they were made."""
        return [group for _subscription, group in self._subscriptions]

    def ensure_sampling(self) -> None:
        """Start the sampling task in the running loop, once (a new loop gets a new task)."""
        if not self.enabled:
            return
        loop = asyncio.get_running_loop()
        if self._task is not None and not self._task.done() and self._task.get_loop() is loop:
            return
        self._task = loop.create_task(self._run(), name="shardyard-consumer-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def sample(self) -> dict[tuple[str, str], int]:
        """Lag by (topic, group) now: for each assigned partition, its end offset minus the consumer's position
        (the next record it hands to the handler). A consumer not started, or between assignments, adds nothing."""
        lag: dict[tuple[str, str], int] = {}
        for subscription, group in list(self._subscriptions):
            consumer: LagSource | None = subscription.consumer
            if consumer is None:
                continue
            partitions = list(consumer.assignment())
            if not partitions:
                continue
            try:
                ends = await consumer.end_offsets(partitions)
            except KafkaError as exc:
                log.debug("end offsets of %s unavailable: %s", sorted({p.topic for p in partitions}), exc)
                continue  # the other consumers are still sampled; this one's topics wait for the next sample
            for partition in partitions:
                try:
                    # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that arrives as
                    # the position does, and the task sampling every second then outlives its stop() (a hung exit).
                    async with asyncio.timeout(self.position_timeout_s):
                        position = await consumer.position(partition)
                except (TimeoutError, IllegalStateError):
                    continue  # revoked or not positioned yet: the next sample sees it
                key = (partition.topic, group)
                lag[key] = lag.get(key, 0) + max(0, ends.get(partition, position) - position)
        self._lag = lag
        return lag

    async def _run(self) -> None:
        while True:
            try:
                await self.sample()
            except asyncio.CancelledError:
                raise
            except Exception:  # a broker hiccup must not end sampling for the process's life
                log.warning("sampling consumer lag failed; next try in %.0fs", self.interval_s, exc_info=True)
            await asyncio.sleep(self.interval_s)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "shardyard_consumer_lag_messages",
            "Messages behind the end of the topic: end offset minus position, summed over assigned partitions",
            labels=["topic", "group"],
        )
        for (topic, group), lag in sorted(self._lag.items()):
            family.add_metric([topic, group], lag)
        yield family


CONSUMER_LAG = ConsumerLag()
REGISTRY.register(CONSUMER_LAG)


def serve_metrics(port: int, *, host: str) -> WSGIServer | None:
    """Serve this process's metrics over HTTP on ``host:port`` (port 0: not at all) and enable lag sampling. The
    server runs on its own daemon thread, so a busy event loop never delays a scrape; it lives as long as the
    process (the returned server is for tests to shut down)."""
    if port == 0:
        return None
    try:
        server, _thread = start_http_server(port, addr=host)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc}") from exc
    CONSUMER_LAG.enabled = True
    return server
