"""Traces: one job is one trace, carried from process to process in Kafka headers (W3C trace context).

Services talk only through Kafka, so the trace context travels with the messages: every event about a job (an event
with a ``job_id``) is published with ``traceparent`` / ``tracestate`` headers, and every consumer records the context
it read for that job. That record (:class:`JobTraces`, one per process) is what later publications about the job
carry, also those decided long after the message that brought the context (a scheduler cycle, a periodic tick, a
shard that ends minutes later). The trace is fixed when a job is admitted: facts with another trace for the same job
(the rejection of a duplicate submission) do not move it, a new acceptance of the id does.

Spans mark the decisions, not the traffic: ``submit`` (CLI), ``admission`` (queue), ``placement``,
``re-placement`` and ``completion`` (scheduler), ``recovery-plan`` (fault manager), ``assignment`` and ``launch``
(agent), ``shard``, ``rendezvous`` and ``sync`` (each shard process), and once a job ended its ``goodput`` ledger,
a child span per stretch of one part (one monitor replica: ``monitor.goodput``). Heartbeats, node states and
progress reports start none. A shard process continues the trace from ``TRACEPARENT`` in its environment.

Why not FastStream's ``KafkaTelemetryMiddleware``: it starts a span for every message published and consumed (one a
second per node for heartbeats alone) and knows nothing of jobs; it also does not cover the follower (plain
aiokafka) or the shard processes.

Export is off unless the standard variables ask for it (:mod:`shardyard.trace_export`, re-exported here); without
a provider the API's no-op tracer still hands the incoming context on, so a process without export keeps a trace
connected at almost no cost.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final, Protocol

from opentelemetry import context, trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from shardyard.trace_export import NAMESPACE as NAMESPACE  # re-exported: callers configure export through here
from shardyard.trace_export import ExportPlan as ExportPlan
from shardyard.trace_export import configure as configure
from shardyard.trace_export import export_plan as export_plan
from shardyard.trace_export import flush as flush

if TYPE_CHECKING:  # the events only for typing (shards do not import them)
    from shardyard.events import Event

TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
HEADER_NAMES: Final = frozenset({TRACEPARENT, TRACESTATE})
ENV_NAMES: Final = {TRACEPARENT: "TRACEPARENT", TRACESTATE: "TRACESTATE"}
"""A child process's environment carries the context under these names (the OTel environment-carrier convention)."""

ACCEPTED: Final = "job.accepted"
"""The type of the event that (re)starts a job's trace: its admission."""
JOB_ID: Final = "shardyard.job_id"
DEFAULT_CAPACITY: Final = 10_000

_PROPAGATOR: Final = TraceContextTextMapPropagator()
_TRACER: Final = trace.get_tracer("shardyard")
_JOB_KEY: Final = context.create_key("shardyard-job")
"""The job the current span belongs to: a publication about that job carries the current span, others do not."""

# --- carriers ----------------------------------------------------------------------------------------------------


def inject(span_context: SpanContext) -> dict[str, str]:
    """``traceparent`` (and ``tracestate`` when there is one) for ``span_context``."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(NonRecordingSpan(span_context)))
    return carrier


def extract(carrier: Mapping[str, str]) -> SpanContext | None:
    """The span context in a ``traceparent`` / ``tracestate`` carrier; None when there is none or it is malformed."""
    if TRACEPARENT not in carrier:
        return None
    found = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    return found if found.is_valid else None


def carrier_of(current_span: Span) -> dict[str, str]:
    """The carrier that makes a receiver's spans children of ``current_span``; empty when it is not sampled into a
    trace (no provider and no parent)."""
    span_context = current_span.get_span_context()
    return inject(span_context) if span_context.is_valid else {}


def from_headers(headers: Iterable[tuple[str, bytes]] | None) -> dict[str, str]:
    """The trace-context entries of Kafka record headers, decoded."""
    return {name: value.decode("latin-1") for name, value in headers or () if name in HEADER_NAMES and value}


def to_headers(carrier: Mapping[str, str]) -> list[tuple[str, bytes]]:
    """A carrier as Kafka record headers (what aiokafka's producer takes)."""
    return [(name, value.encode("latin-1")) for name, value in carrier.items()]


def from_env(env: Mapping[str, str]) -> dict[str, str]:
    """The carrier a parent process left in ``TRACEPARENT`` / ``TRACESTATE``."""
    return {name: env[var] for name, var in ENV_NAMES.items() if env.get(var)}


def child_env(env: Mapping[str, str], job_id: str, traces: JobTraces | None = None) -> dict[str, str]:
    """``env`` for a child process that continues ``job_id``'s trace: the job's current context, never one the
    parent inherited."""
    out = {name: value for name, value in env.items() if name not in ENV_NAMES.values()}
    span_context = current(job_id, traces or JOBS)
    if span_context is not None:
        out.update({ENV_NAMES[name]: value for name, value in inject(span_context).items()})
    return out


# --- the job -> trace record -------------------------------------------------------------------------------------


class JobTraces:
    """Per job, the newest span context this process knows of that job's trace; bounded (least recently recorded
    jobs are forgotten first), because a long-running service sees an unbounded number of jobs."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._contexts: OrderedDict[str, SpanContext] = OrderedDict()

    def record(self, job_id: str, span_context: SpanContext, *, restart: bool = False) -> None:
        """Remember ``span_context`` for ``job_id``; a context of another trace replaces the job's only with
        ``restart`` (the job was admitted anew) or when the job has none."""
        if not span_context.is_valid:
            return
        known = self._contexts.get(job_id)
        if known is not None and known.trace_id != span_context.trace_id and not restart:
            return
        self._contexts[job_id] = span_context
        self._contexts.move_to_end(job_id)
        while len(self._contexts) > self.capacity:
            self._contexts.popitem(last=False)

    def get(self, job_id: str) -> SpanContext | None:
        return self._contexts.get(job_id)

    def __len__(self) -> int:
        return len(self._contexts)


JOBS: Final = JobTraces()
"""This process's record. Process-wide like the tracer provider itself: the bus layer and the handlers share it."""


_NAMES_A_JOB: dict[type, bool] = {}


def _may_name_a_job(kind: type) -> bool:
    """False for event models without a ``job_id`` field (heartbeats, node states): no attribute lookup per message."""
    known = _NAMES_A_JOB.get(kind)
    if known is None:
        fields = getattr(kind, "model_fields", None)
        known = _NAMES_A_JOB[kind] = "job_id" in fields if isinstance(fields, dict) else True
    return known


def job_of(event: object) -> str | None:
    """The job an event is about (any event with a ``job_id``), else None."""
    if not _may_name_a_job(type(event)):
        return None
    job_id = getattr(event, "job_id", None)
    return job_id if isinstance(job_id, str) and job_id else None


def observe(event: object, headers: Iterable[tuple[str, bytes]] | None, traces: JobTraces = JOBS) -> None:
    """A consumed message: record the trace context it carries for its job. An acceptance (re)starts the job's
    trace; any other fact only moves it along within that trace."""
    job_id = job_of(event)
    if job_id is None or not headers:
        return
    span_context = extract(from_headers(headers))
    if span_context is not None:
        traces.record(job_id, span_context, restart=getattr(event, "type", None) == ACCEPTED)


def current(job_id: str, traces: JobTraces = JOBS) -> SpanContext | None:
    """The context a publication about ``job_id`` carries: the current span when it belongs to that job, else the
    job's recorded context."""
    if context.get_value(_JOB_KEY) == job_id:
        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid:
            return span_context
    return traces.get(job_id)


def headers_for(event: Event, traces: JobTraces = JOBS) -> dict[str, str] | None:
    """Kafka headers for publishing ``event``: its job's trace context, or None (not about a job, or no trace)."""
    job_id = job_of(event)
    if job_id is None:
        return None
    span_context = current(job_id, traces)
    return inject(span_context) if span_context is not None else None


# --- spans -------------------------------------------------------------------------------------------------------

Attributes = Mapping[str, AttributeValue]


def event_attributes(event: object) -> dict[str, AttributeValue]:
    """The identifying fields of an event, as span attributes."""
    out: dict[str, AttributeValue] = {}
    for name in ("job_id", "attempt", "shard_index", "node_id", "cause"):
        value = getattr(event, name, None)
        if isinstance(value, str | int) and not isinstance(value, bool):
            out[f"shardyard.{name}"] = str(value) if isinstance(value, str) else value
    return out


def _rooted(parent: SpanContext | None) -> context.Context:
    """A fresh context (nothing of the caller's current one) whose span is ``parent``; empty: a new trace."""
    empty = context.Context()
    return empty if parent is None else trace.set_span_in_context(NonRecordingSpan(parent), empty)


def _start(
    name: str,
    job_id: str,
    parent: SpanContext | None,
    *,
    start_time: int | None,
    attributes: Attributes | None,
    kind: SpanKind,
) -> Span:
    return _TRACER.start_span(
        name,
        context=_rooted(parent),
        kind=kind,
        start_time=start_time,
        attributes={JOB_ID: job_id, **(attributes or {})},
    )


@contextmanager
def _within(job_id: str, span: Span) -> Iterator[None]:
    """Make ``span`` current, as ``job_id``'s (publications about that job inside carry it)."""
    token = context.attach(context.set_value(_JOB_KEY, job_id, trace.set_span_in_context(span)))
    try:
        yield
    finally:
        context.detach(token)


@contextmanager
def job_span(
    name: str,
    job_id: str,
    *,
    parent: SpanContext | None = None,
    restart: bool = False,
    start_time: int | None = None,
    attributes: Attributes | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    traces: JobTraces = JOBS,
) -> Iterator[Span]:
    """A span of ``job_id``'s trace: a child of ``parent``, by default the job's recorded context (a new trace when
    there is none). Inside it, publications about the job are its children, and it stays the job's recorded context
    afterwards. An exception marks it failed."""
    origin = parent if parent is not None else traces.get(job_id)
    started = _start(name, job_id, origin, start_time=start_time, attributes=attributes, kind=kind)
    traces.record(job_id, started.get_span_context(), restart=restart)
    with trace.use_span(started, end_on_exit=True), _within(job_id, started):
        yield started


@contextmanager
def span(name: str, attributes: Attributes | None = None, *, parent: SpanContext | None = None) -> Iterator[Span]:
    """A span in the current context (or under ``parent``): for code that is not about one job's events, such as a
    shard process's own work."""
    base = None if parent is None else _rooted(parent)
    with _TRACER.start_as_current_span(name, context=base, attributes=attributes) as current_span:
        yield current_span


def record_stretches(
    job_id: str,
    name: str,
    stretches: Sequence[tuple[str, datetime, datetime]],
    *,
    attributes: Attributes | None = None,
    traces: JobTraces = JOBS,
) -> None:
    """Spans after the fact, in ``job_id``'s trace: one ``name`` span from the first stretch's start to the last's
    end, with a child span per stretch, named by its label. For accounts made once the time has passed (the goodput
    ledger: ``monitor.goodput``); they leave the job's recorded context as it was."""
    if not stretches:
        return
    outer = _start(
        name, job_id, traces.get(job_id), start_time=_ns(stretches[0][1]), attributes=attributes, kind=SpanKind.INTERNAL
    )
    within = outer.get_span_context()
    for label, began, ended in stretches:
        inner = _start(label, job_id, within, start_time=_ns(began), attributes=None, kind=SpanKind.INTERNAL)
        inner.end(end_time=_ns(ended))
    outer.end(end_time=_ns(stretches[-1][2]))


def _ns(at: datetime) -> int:
    return (at - _EPOCH) // timedelta(microseconds=1) * 1000


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


class Publisher(Protocol):
    async def send(self, event: Event) -> Awaitable[object]:
        """Hand ``event`` to the producer (its headers taken now); the result is awaited for the broker's ack."""
        ...


async def publish_spanned(
    bus: Publisher,
    events: Sequence[Event],
    names: Mapping[type[Event], str],
    *,
    start_time: int | None = None,
    traces: JobTraces = JOBS,
) -> None:
    """Publish ``events`` in order. The first event of a type in ``names`` opens that span for its job (from
    ``start_time``: when the decision began), and it and the job's later events in the batch are published inside
    it; the spans end once the batch is out. Order is kept across jobs: per-node assignment order matters. Every
    event is handed to the producer before any acknowledgement is awaited (one round trip for the batch)."""
    opened: dict[str, Span] = {}
    sent: list[Awaitable[object]] = []
    try:
        for event in events:
            job_id = job_of(event)
            name = names.get(type(event))
            if job_id is not None and name is not None and job_id not in opened:
                started = _start(
                    name,
                    job_id,
                    traces.get(job_id),
                    start_time=start_time,
                    attributes=event_attributes(event),
                    kind=SpanKind.INTERNAL,
                )
                traces.record(job_id, started.get_span_context())
                opened[job_id] = started
            if job_id is not None and job_id in opened:
                with _within(job_id, opened[job_id]):
                    sent.append(await bus.send(event))
            else:
                sent.append(await bus.send(event))
        await asyncio.gather(*sent)
    except Exception as exc:
        for failed in opened.values():
            failed.record_exception(exc)
            failed.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        for done in opened.values():
            done.end()
