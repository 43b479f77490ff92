"""Every process's own metrics (``shardyard.metrics``): events by topic, handler latency, consumer lag, the
scheduler's decisions and cycle latency, and the HTTP endpoint that serves them with the process collectors.

The metrics live on prometheus-client's default registry for the life of the process, so tests compare deltas."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Awaitable, Callable, Iterable

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError, KafkaConnectionError
from faststream.kafka import TestKafkaBroker
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from shardyard import metrics
from shardyard.broker.ports import free_port
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.topics import SHARD_EVENTS
from shardyard.errors import ConfigError
from shardyard.events import Event, JobPreempting, JobReady, JobScheduled, JobUnschedulable, PendingReason
from shardyard.metrics import ConsumerLag, handling, observe_cycle, serve_metrics
from shardyard.scheduler.book import SchedulerBook
from shardyard.scheduler.handlers import SchedulerHandlers
from tests.support import wait
from tests.support.clock import FakeClock
from tests.unit.builders import at, gpus, job_spec, node_state, progress

DEADLINE_S = 5.0


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# --- consumer lag ---------------------------------------------------------------------------------------------------
class FakeConsumer:
    """The slice of ``AIOKafkaConsumer`` lag sampling uses: an assignment, end offsets and positions."""

    def __init__(self, ends: dict[TopicPartition, int], positions: dict[TopicPartition, int | None]) -> None:
        self.ends = ends
        self.positions = positions
        self.revoked: set[TopicPartition] = set()
        self.failures: list[Exception] = []

    def assignment(self) -> Iterable[TopicPartition]:
        return set(self.ends)

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        if self.failures:
            raise self.failures.pop()
        return {tp: self.ends[tp] for tp in partitions}

    async def position(self, partition: TopicPartition) -> int:
        if partition in self.revoked:
            raise IllegalStateError(f"Partition {partition} is not assigned")
        position = self.positions[partition]
        if position is None:
            await asyncio.Event().wait()  # never positioned (aiokafka waits for a reset)
        assert position is not None
        return position


class FakeSubscription:
    def __init__(self, consumer: FakeConsumer | None) -> None:
        self.consumer = consumer


A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def lag_of(lag: ConsumerLag) -> dict[tuple[str, str], float]:
    [family] = list(lag.collect())
    return {(s.labels["topic"], s.labels["group"]): s.value for s in family.samples}


async def test_lag_is_end_offset_minus_position_summed_per_topic_and_group() -> None:
    lag = ConsumerLag()
    lag.track(FakeSubscription(FakeConsumer({A0: 10, A1: 5}, {A0: 7, A1: 5})), group="queue")
    lag.track(FakeSubscription(FakeConsumer({A0: 10, B0: 4}, {A0: 10, B0: 1})), group=None)

    assert await lag.sample() == {("a", "queue"): 3, ("a", "none"): 0, ("b", "none"): 3}
    assert lag_of(lag) == {("a", "queue"): 3.0, ("a", "none"): 0.0, ("b", "none"): 3.0}


async def test_consumers_not_started_and_partitions_revoked_or_not_positioned_add_nothing() -> None:
    consumer = FakeConsumer({A0: 10, A1: 10, B0: 10}, {A0: 4, A1: None, B0: 0})
    consumer.revoked.add(B0)
    lag = ConsumerLag(position_timeout_s=0.05)
    lag.track(FakeSubscription(None), group="g")
    lag.track(FakeSubscription(consumer), group="g")

    assert await lag.sample() == {("a", "g"): 6}


class ArrivingConsumer(FakeConsumer):
    """A position that arrives when the test says so (as a sampler is being stopped)."""

    def __init__(self, ends: dict[TopicPartition, int], arrival: asyncio.Future[int]) -> None:
        super().__init__(ends, {})
        self.arrival = arrival

    async def position(self, partition: TopicPartition) -> int:
        return await self.arrival


async def test_a_sampler_stopped_as_a_position_arrives_stops() -> None:
    arrival: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    lag = ConsumerLag()
    lag.track(FakeSubscription(ArrivingConsumer({A0: 10}, arrival)), group="g")
    sampling = asyncio.create_task(lag.sample())
    await asyncio.sleep(0.01)  # waiting for the position

    arrival.set_result(3)
    sampling.cancel()

    with pytest.raises(asyncio.CancelledError):  # not swallowed: a periodic sampler would outlive its stop()
        await sampling


async def test_sampling_starts_once_enabled_reports_the_latest_sample_and_survives_a_failure() -> None:
    consumer = FakeConsumer({A0: 10}, {A0: 2})
    consumer.failures.append(KafkaConnectionError())
    lag = ConsumerLag(interval_s=0.01)
    lag.track(FakeSubscription(consumer), group="g")

    lag.ensure_sampling()
    assert lag_of(lag) == {}  # not enabled: no task, nothing sampled

    lag.enabled = True
    lag.ensure_sampling()
    lag.ensure_sampling()  # one task per loop
    try:
        await wait.eventually(lambda: lag_of(lag) == {("a", "g"): 8.0}, "lag 8", DEADLINE_S, every_s=0.01)
        consumer.positions[A0] = 10
        await wait.eventually(lambda: lag_of(lag) == {("a", "g"): 0.0}, "lag 0", DEADLINE_S, every_s=0.01)
    finally:
        await lag.stop()


# --- events and handlers --------------------------------------------------------------------------------------------
def test_handling_counts_and_times_a_message_however_it_ends() -> None:
    topic = "test.handling"
    before = (
        sample("shardyard_events_consumed_total", topic=topic),
        sample("shardyard_handler_seconds_count", topic=topic),
    )

    with handling(topic):
        pass
    with pytest.raises(RuntimeError), handling(topic):
        raise RuntimeError("handler failed")

    assert sample("shardyard_events_consumed_total", topic=topic) == before[0] + 2
    assert sample("shardyard_handler_seconds_count", topic=topic) == before[1] + 2


async def test_the_bus_counts_consumed_published_and_dead_lettered_messages_by_topic() -> None:
    topic = SHARD_EVENTS.name
    names = (
        "shardyard_events_consumed_total",
        "shardyard_events_published_total",
        "shardyard_events_dead_lettered_total",
    )
    before = [sample(name, topic=topic) for name in names]
    broker = make_broker("127.0.0.1:9092", client_id="test")
    bus = Bus(broker, service="fault-manager")  # the service that dead-letters shard events' bad records
    handled: list[object] = []

    async def handle(event: object) -> None:
        handled.append(event)

    bus.subscribe({SHARD_EVENTS: handle}, group="test-group")
    async with TestKafkaBroker(broker):
        await bus.publish(progress())
        await broker.publish(b"not json", topic=topic)

    assert len(handled) == 1
    assert [sample(name, topic=topic) - b for name, b in zip(names, before, strict=True)] == [2, 1, 1]
    assert "test-group" in metrics.CONSUMER_LAG.groups


# --- the scheduler --------------------------------------------------------------------------------------------------
def decisions(kind: str) -> float:
    return sample("shardyard_placement_decisions_total", kind=kind)


def test_every_decision_kind_is_exported_from_zero() -> None:
    for kind in ("place", "preempt", "unschedulable"):
        assert REGISTRY.get_sample_value("shardyard_placement_decisions_total", {"kind": kind}) is not None


def test_a_cycle_is_timed_and_its_decisions_counted_by_kind() -> None:
    before = {kind: decisions(kind) for kind in ("place", "preempt", "unschedulable")}
    cycles = sample("shardyard_placement_cycle_seconds_count")
    unschedulable = JobUnschedulable(occurred_at=at(0), job_id="b", reason=PendingReason.NO_FIT, message="m")
    preempting = JobPreempting(occurred_at=at(0), job_id="c", attempt=1, by_job="d", deadline_s=30.0)

    observe_cycle(0.02, [unschedulable, preempting, preempting, progress()])

    assert {kind: decisions(kind) - before[kind] for kind in before} == {"place": 0, "preempt": 2, "unschedulable": 1}
    assert sample("shardyard_placement_cycle_seconds_count") == cycles + 1


class RecordingBus:
    def __init__(self) -> None:
        self.published: list[Event] = []

    async def publish(self, event: Event) -> None:
        self.published.append(event)

    async def send(self, event: Event) -> Awaitable[object]:
        self.published.append(event)
        return asyncio.sleep(0)

    async def publish_all(self, events: Iterable[Event]) -> None:
        self.published.extend(events)


async def _confirmed(_term: int) -> bool:
    return True


async def test_the_leaders_cycle_records_its_latency_and_placements() -> None:
    book = SchedulerBook(term=1)
    book.apply(node_state("node-a", gpus=gpus(count=2)))
    book.apply(JobReady(occurred_at=at(0), job_id="job-m", spec=job_spec(job_id="job-m")))
    bus = RecordingBus()
    confirm: Callable[[int], Awaitable[bool]] = _confirmed
    handlers = SchedulerHandlers(book, bus, FakeClock(at(1), step_s=0.25), confirm=confirm)  # type: ignore[arg-type]
    handlers.leading = True
    placed, total = decisions("place"), sample("shardyard_placement_cycle_seconds_sum")

    await handlers.cycle()

    assert any(isinstance(event, JobScheduled) for event in bus.published)
    assert decisions("place") == placed + 1
    assert sample("shardyard_placement_cycle_seconds_sum") == pytest.approx(total + 0.25)


# --- the endpoint ---------------------------------------------------------------------------------------------------
def test_metrics_port_zero_serves_nothing() -> None:
    assert serve_metrics(0, host="127.0.0.1") is None


def test_the_endpoint_serves_shardyard_and_process_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics.CONSUMER_LAG, "enabled", False)  # restored afterwards: other tests' loops stay quiet
    port = free_port()
    server = serve_metrics(port, host="127.0.0.1")
    assert server is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=DEADLINE_S) as response:
            text = response.read().decode()
        assert metrics.CONSUMER_LAG.enabled
        with pytest.raises(ConfigError, match=str(port)):
            serve_metrics(port, host="127.0.0.1")  # the port is taken: a configuration error, not a traceback
    finally:
        server.shutdown()
        server.server_close()

    families = {family.name for family in text_string_to_metric_families(text)}
    expected = {"shardyard_events_consumed", "shardyard_placement_cycle_seconds", "shardyard_consumer_lag_messages"}
    assert expected | {"process_cpu_seconds", "python_info"} <= families
