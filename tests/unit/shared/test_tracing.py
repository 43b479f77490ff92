"""Trace context across processes: which variables turn export on, header and environment carriers, the per-process
job -> trace record, and the spans the handlers open around their decisions."""

from collections.abc import Awaitable, Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from shardyard import tracing
from shardyard.events import Event, JobScheduled
from shardyard.tracing import ExportPlan, JobTraces
from tests.unit.builders import T0, assignment, heartbeat, progress, scheduled, started

TRACE_A = 0x0AF7651916CD43DD8448EB211C80319C
TRACE_B = 0x4BF92F3577B34DA6A3CE929D0E0E4736


def context_of(trace_id: int = TRACE_A, span_id: int = 0xB7AD6B7169203331, state: str = "") -> SpanContext:
    return SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState.from_header([state]) if state else TraceState(),
    )


# --- which variables turn export on ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "plan"),
    [
        ({}, None),
        ({"OTEL_SERVICE_NAME": "x"}, None),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"},
            ExportPlan(("otlp",), "http/protobuf", "http://collector:4318/v1/traces"),
        ),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:9999/custom"},
            ExportPlan(("otlp",), "http/protobuf", "http://c:9999/custom"),
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ExportPlan(("otlp",), "http/protobuf", "http://localhost:4318/v1/traces")),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
        (
            {"OTEL_TRACES_EXPORTER": "console,otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
            ExportPlan(("console", "otlp"), "http/protobuf", "http://c:4318/v1/traces"),
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            ExportPlan(("otlp",), "grpc", "http://c:4317"),
        ),
    ],
    ids=[
        "nothing-set",
        "service-name-alone",
        "base-endpoint",
        "traces-endpoint-as-is",
        "exporter-named-default-endpoint",
        "exporter-none-wins",
        "sdk-disabled",
        "console-and-otlp",
        "grpc-base-endpoint",
    ],
)
def test_export_only_when_the_environment_asks(env: dict[str, str], plan: ExportPlan | None) -> None:
    assert tracing.export_plan(env) == plan


def test_configure_without_export_variables_installs_nothing() -> None:
    assert tracing.configure("shardyard-test", {}) is False


# --- carriers ----------------------------------------------------------------------------------------------------


def test_inject_then_extract_gives_back_the_context_and_its_state() -> None:
    original = context_of(state="vendor=abc")
    carrier = tracing.inject(original)
    assert carrier["traceparent"] == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert carrier["tracestate"] == "vendor=abc"
    found = tracing.extract(carrier)
    assert found is not None
    assert (found.trace_id, found.span_id, found.trace_state.get("vendor")) == (TRACE_A, original.span_id, "abc")


@pytest.mark.parametrize(
    "carrier",
    [{}, {"traceparent": "garbage"}, {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"}],
    ids=["absent", "malformed", "all-zero-trace-id"],
)
def test_extract_refuses_what_is_not_a_context(carrier: dict[str, str]) -> None:
    assert tracing.extract(carrier) is None


def test_kafka_headers_round_trip_and_other_headers_are_ignored() -> None:
    carrier = tracing.inject(context_of())
    headers = [*tracing.to_headers(carrier), ("correlation_id", b"abc"), ("tracestate", b"")]
    assert tracing.from_headers(headers) == carrier
    assert tracing.from_headers(None) == {}


def test_a_child_process_gets_the_jobs_context_never_an_inherited_one() -> None:
    traces = JobTraces()
    inherited = {"PATH": "/bin", "TRACEPARENT": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    assert tracing.child_env(inherited, "job-unknown", traces) == {"PATH": "/bin"}
    traces.record("job-env", context_of())
    env = tracing.child_env(inherited, "job-env", traces)
    assert env["TRACEPARENT"] == tracing.inject(context_of())["traceparent"]
    assert tracing.extract(tracing.from_env(env)) == context_of()


# --- the job -> trace record -------------------------------------------------------------------------------------


def test_the_record_moves_within_a_trace_and_only_an_admission_restarts_it() -> None:
    traces = JobTraces()
    first = context_of(TRACE_A, 1)
    traces.record("job-1", first)
    traces.record("job-1", context_of(TRACE_A, 2))
    assert traces.get("job-1") == context_of(TRACE_A, 2)
    traces.record("job-1", context_of(TRACE_B, 3))  # e.g. the rejection of a duplicate submission
    assert traces.get("job-1") == context_of(TRACE_A, 2)
    traces.record("job-1", context_of(TRACE_B, 4), restart=True)  # the id admitted anew
    assert traces.get("job-1") == context_of(TRACE_B, 4)


def test_the_record_ignores_invalid_contexts_and_forgets_the_oldest_jobs() -> None:
    traces = JobTraces(capacity=2)
    traces.record("job-0", SpanContext(trace_id=0, span_id=0, is_remote=False))
    assert traces.get("job-0") is None
    for index in range(3):
        traces.record(f"job-{index}", context_of(span_id=index + 1))
    traces.record("job-1", context_of(span_id=9))  # recorded again: the most recent
    traces.record("job-3", context_of(span_id=4))
    assert (traces.get("job-0"), traces.get("job-2")) == (None, None)
    assert traces.get("job-1") == context_of(span_id=9) and len(traces) == 2


def test_consumed_messages_record_their_jobs_context() -> None:
    traces = JobTraces()
    headers = tracing.to_headers(tracing.inject(context_of()))
    tracing.observe(progress("job-seen"), headers, traces)
    tracing.observe(heartbeat(), headers, traces)  # about a node: nothing to record
    tracing.observe(progress("job-bare"), [("correlation_id", b"x")], traces)
    assert traces.get("job-seen") == context_of()
    assert traces.get("job-bare") is None and len(traces) == 1


def test_an_acceptance_restarts_the_trace_of_a_job_id() -> None:
    traces = JobTraces()
    traces.record("job-1", context_of(TRACE_A))

    class Accepted:
        type = "job.accepted"
        job_id = "job-1"

    tracing.observe(Accepted(), tracing.to_headers(tracing.inject(context_of(TRACE_B))), traces)
    assert traces.get("job-1") == context_of(TRACE_B)


def test_publications_carry_the_jobs_recorded_context() -> None:
    traces = JobTraces()
    traces.record("job-1", context_of())
    assert tracing.headers_for(progress("job-1"), traces) == tracing.inject(context_of())
    assert tracing.headers_for(progress("job-2"), traces) is None
    assert tracing.headers_for(heartbeat(), traces) is None


# --- spans -------------------------------------------------------------------------------------------------------


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """A recording tracer for this test only (the process-wide provider stays unset)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_TRACER", provider.get_tracer("test"))
    yield exporter
    provider.shutdown()


def only(finished: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    matching = [span for span in finished if span.name == name]
    assert len(matching) == 1, [span.name for span in finished]
    return matching[0]


def test_a_job_span_continues_the_jobs_trace_and_its_publications_are_its_children(
    spans: InMemorySpanExporter,
) -> None:
    traces = JobTraces()
    traces.record("job-1", context_of())
    traces.record("job-2", context_of(TRACE_B))
    with tracing.job_span("assignment", "job-1", traces=traces) as span:
        mine = tracing.headers_for(started("job-1"), traces)
        other = tracing.headers_for(started("job-2"), traces)
    assert mine == tracing.inject(span.get_span_context())
    assert other == tracing.inject(context_of(TRACE_B))  # another job's publication keeps its own trace
    finished = only(spans.get_finished_spans(), "assignment")
    assert finished.context is not None and finished.parent is not None
    assert (finished.context.trace_id, finished.parent.span_id) == (TRACE_A, context_of().span_id)
    assert finished.attributes is not None and finished.attributes[tracing.JOB_ID] == "job-1"
    assert traces.get("job-1") == finished.context  # later publications (a tick, a shard's end) follow it


def test_a_job_without_a_trace_gets_a_new_one_and_an_explicit_parent_wins(spans: InMemorySpanExporter) -> None:
    traces = JobTraces()
    with tracing.job_span("placement", "job-new", traces=traces):
        pass
    with tracing.job_span("admission", "job-sub", parent=context_of(TRACE_B), restart=True, traces=traces):
        pass
    placement = only(spans.get_finished_spans(), "placement")
    admission = only(spans.get_finished_spans(), "admission")
    assert placement.parent is None and admission.context is not None
    assert admission.context.trace_id == TRACE_B
    assert traces.get("job-sub") == admission.context


async def acknowledged() -> None:
    """The broker's acknowledgement of a send, at once."""


class Recorder:
    """A bus that remembers each event with the headers it would have carried."""

    def __init__(self, traces: JobTraces) -> None:
        self.traces = traces
        self.sent: list[tuple[Event, dict[str, str] | None]] = []

    async def send(self, event: Event) -> Awaitable[object]:
        self.sent.append((event, tracing.headers_for(event, self.traces)))
        return acknowledged()


async def test_a_batch_opens_one_span_per_decided_job_keeps_order_and_parents_the_jobs_events(
    spans: InMemorySpanExporter,
) -> None:
    traces = JobTraces()
    traces.record("job-1", context_of())
    bus = Recorder(traces)
    events: list[Event] = [
        scheduled("job-1"),
        assignment("job-1", 0),
        progress("job-other"),
        assignment("job-1", 1),
    ]
    await tracing.publish_spanned(
        bus, events, {JobScheduled: "placement"}, start_time=int(T0.timestamp() * 1e9), traces=traces
    )
    placement = only(spans.get_finished_spans(), "placement")
    assert placement.context is not None and placement.parent is not None
    assert placement.parent.span_id == context_of().span_id
    assert placement.start_time == int(T0.timestamp() * 1e9)
    assert [event for event, _ in bus.sent] == events
    expected = tracing.inject(placement.context)
    assert [headers for event, headers in bus.sent if tracing.job_of(event) == "job-1"] == [expected] * 3
    assert bus.sent[2][1] is None  # no trace for that job, and the batch's span is not its parent


async def test_a_failed_publication_marks_the_batch_span_failed(spans: InMemorySpanExporter) -> None:
    class Broken:
        async def send(self, event: Event) -> Awaitable[object]:
            raise OSError("broker gone")

    with pytest.raises(OSError):
        await tracing.publish_spanned(Broken(), [scheduled("job-1")], {JobScheduled: "placement"}, traces=JobTraces())
    placement = only(spans.get_finished_spans(), "placement")
    assert not placement.status.is_ok and placement.events[0].name == "exception"
