"""Trace export: which of the standard OpenTelemetry variables ask a process to export its spans
(:func:`export_plan`), and the tracer provider that then does (:func:`configure`, once per process). Nothing is
exported unless they ask. The spans themselves, and the trace context the messages carry, are
:mod:`shardyard.tracing`, which re-exports these names.

The SDK and the exporters are imported only where export is on: a process without it runs on the API's no-op tracer.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from opentelemetry import trace

if TYPE_CHECKING:  # the SDK loads only where export is on
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("shardyard.tracing")  # the name these records had before export left shardyard.tracing

NAMESPACE: Final = "shardyard"


@dataclass(frozen=True)
class ExportPlan:
    """What the standard OpenTelemetry variables ask this process to export."""

    exporters: tuple[str, ...]
    """``otlp`` and/or ``console``."""
    protocol: str
    """``http/protobuf`` or ``grpc`` (OTLP only)."""
    endpoint: str
    """The OTLP traces endpoint (for http/protobuf: the full URL, ``.../v1/traces``)."""


def export_plan(env: Mapping[str, str]) -> ExportPlan | None:
    """None (export nothing) unless the environment asks for traces: ``OTEL_TRACES_EXPORTER`` names exporters, or an
    OTLP endpoint is set (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``). Unlike the SDK's
    own default (``otlp`` to localhost), nothing is exported by default: a laptop cluster has no collector."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    signal_endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    base_endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    named = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if named:
        exporters = tuple(dict.fromkeys(part.strip() for part in named.split(",") if part.strip() != "none"))
    else:
        exporters = ("otlp",) if signal_endpoint or base_endpoint else ()
    exporters = tuple(name for name in exporters if name)
    if not exporters:
        return None
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    ).strip()
    if signal_endpoint:
        endpoint = signal_endpoint
    elif protocol == "grpc":
        endpoint = base_endpoint or "http://localhost:4317"
    else:
        endpoint = (base_endpoint or "http://localhost:4318").rstrip("/") + "/v1/traces"
    return ExportPlan(exporters=exporters, protocol=protocol, endpoint=endpoint)


_provider: TracerProvider | None = None


def configure(service: str, env: Mapping[str, str], *, instance: str | None = None) -> bool:
    """Install this process's tracer provider (``service.name`` = ``service``) when ``env`` asks for export; True
    when it did. Once per process: later calls change nothing. The provider flushes and shuts down at exit (the
    SDK's exit hook), so a short-lived process (a shard, the CLI) still delivers its spans."""
    global _provider
    if _provider is not None:
        return True
    plan = export_plan(env)
    if plan is None:
        return False
    exporters = [exporter for name in plan.exporters if (exporter := _exporter(name, plan)) is not None]
    if not exporters:
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create(
        {
            "service.name": service,
            "service.namespace": NAMESPACE,
            "service.instance.id": instance or f"{socket.gethostname()}-{os.getpid()}",
            "process.pid": os.getpid(),
        }
    )
    provider = TracerProvider(resource=resource)  # the sampler follows OTEL_TRACES_SAMPLER (default: parent-based)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))  # OTEL_BSP_* tune the batching
    trace.set_tracer_provider(provider)
    _provider = provider
    log.info("exporting traces of %s to %s (%s)", service, plan.endpoint, ", ".join(plan.exporters))
    return True


def _exporter(name: str, plan: ExportPlan) -> SpanExporter | None:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        log.warning("OTEL_TRACES_EXPORTER=%s is not supported (otlp, console): ignored", name)
        return None
    if plan.protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            log.warning("OTLP over grpc needs opentelemetry-exporter-otlp-proto-grpc; no traces are exported")
            return None
        grpc_exporter: SpanExporter = GrpcExporter(endpoint=plan.endpoint)
        return grpc_exporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=plan.endpoint)


def flush(timeout_ms: int = 5000) -> bool:
    """Export what is buffered now (True when it all went out, or there is no provider)."""
    return _provider.force_flush(timeout_ms) if _provider is not None else True
