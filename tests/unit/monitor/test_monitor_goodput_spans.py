"""A job that ends gets its goodput ledger as spans of its own trace: a ``goodput`` span over its life with its ETTR,
and a child span per stretch of one part, sent by one monitor replica, only for an end read live."""

import zlib
from collections.abc import Iterator

import pytest
from aiokafka import ConsumerRecord
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, TraceFlags

from shardyard import tracing
from shardyard.bus.codec import encode
from shardyard.bus.topics import LIFECYCLE, SHARD_EVENTS, Topic
from shardyard.events import Event, ShardProgress
from shardyard.monitor.handlers import MonitorHandlers
from shardyard.monitor.metrics import MonitorMetrics
from shardyard.monitor.views import ClusterView
from tests.unit.monitor.test_monitor_goodput import team_job
from tests.unit.monitor.test_monitor_handlers import DeadLetters

TRACE = 0x0AF7651916CD43DD8448EB211C80319C
SUBMIT = SpanContext(trace_id=TRACE, span_id=0xB7AD6B7169203331, is_remote=True, trace_flags=TraceFlags(1))


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_TRACER", provider.get_tracer("test"))
    yield exporter
    provider.shutdown()


def record(topic: Topic, event: Event, offset: int, timestamp_ms: int) -> ConsumerRecord[bytes, bytes]:
    value = encode(event)
    headers = tuple(tracing.to_headers(tracing.inject(SUBMIT)))
    return ConsumerRecord(topic.name, 0, offset, timestamp_ms, 0, b"k", value, None, 1, len(value), headers)


def replica(job_id: str, *, tracing_it: bool, since_ms: int = 0) -> MonitorHandlers:
    """One of two replicas: the one whose share the job id's hash names, or the other."""
    view = ClusterView()
    this = zlib.crc32(job_id.encode()) % 2 if tracing_it else 1 - zlib.crc32(job_id.encode()) % 2
    return MonitorHandlers(view, MonitorMetrics(view).events, DeadLetters(), share=(this, 2), since_ms=since_ms)  # type: ignore[arg-type]


async def run(handlers: MonitorHandlers, job_id: str, timestamp_ms: int = 1_000) -> None:
    for offset, event in enumerate(team_job(job_id, "team-a", ends_at=60)):
        topic = SHARD_EVENTS if isinstance(event, ShardProgress) else LIFECYCLE
        await handlers.on_records(topic, [record(topic, event, offset, timestamp_ms)])  # type: ignore[arg-type]


async def test_the_ended_jobs_ledger_is_a_span_per_stretch_in_its_trace(spans: InMemorySpanExporter) -> None:
    await run(replica("traced-1", tracing_it=True), "traced-1")

    finished = {s.name: s for s in spans.get_finished_spans()}
    assert set(finished) == {"goodput", "queued", "recovery", "productive"}
    outer = finished["goodput"]
    assert outer.context.trace_id == TRACE and outer.parent is not None and outer.parent.span_id == SUBMIT.span_id
    assert outer.attributes is not None and outer.attributes["shardyard.ettr"] == pytest.approx(40 / 60)
    seconds = {
        name: (s.end_time - s.start_time) / 1e9  # type: ignore[operator]
        for name, s in finished.items()
        if name != "goodput"
    }
    assert seconds == {"queued": 10.0, "recovery": 10.0, "productive": 40.0}
    assert all(
        s.parent is not None and s.parent.span_id == outer.context.span_id
        for n, s in finished.items()
        if n != "goodput"
    )


async def test_only_one_replica_traces_a_job(spans: InMemorySpanExporter) -> None:
    await run(replica("traced-2", tracing_it=False), "traced-2")

    assert spans.get_finished_spans() == ()


async def test_an_end_read_again_on_a_rebuild_is_not_traced_again(spans: InMemorySpanExporter) -> None:
    await run(replica("traced-3", tracing_it=True, since_ms=5_000), "traced-3", timestamp_ms=1_000)

    assert spans.get_finished_spans() == ()
