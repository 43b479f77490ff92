"""An OTLP/HTTP (protobuf) traces endpoint in the test process, so tests can read the spans a cluster exports.

A person can run it too, to see a local cluster's traces without Jaeger: ``python -m tests.support.otlp --port 4318``
prints one line per span it is sent (trace id, process, span, job); point the cluster at it with
``OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318``."""

import argparse
import contextlib
import gzip
import json
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    service: str
    pid: int
    attributes: dict[str, object]

    @property
    def process(self) -> tuple[str, int]:
        """The process that sent the span: its ``service.name`` and ``process.pid``."""
        return self.service, self.pid


def _value(value: AnyValue) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


class OtlpReceiver:
    """Listens on ``host:port`` (a free port by default) for ``POST /v1/traces`` and keeps every span it is sent;
    ``on_spans`` sees each batch as it arrives."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, on_spans: Callable[[list[ReceivedSpan]], None] | None = None
    ) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._on_spans = on_spans
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.endpoint = f"http://{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)

    def add(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            service=str(resource.get("service.name")),
                            pid=int(str(resource.get("process.pid", 0))),
                            attributes={kv.key: _value(kv.value) for kv in span.attributes},
                        )
                    )
        with self._lock:
            self.spans.extend(received)
        if self._on_spans is not None:
            self._on_spans(received)

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def job_trace(self, job_id: str) -> list[ReceivedSpan]:
        """Every span of the trace(s) that carry ``job_id``."""
        spans = self.snapshot()
        traces = {s.trace_id for s in spans if s.attributes.get("shardyard.job_id") == job_id}
        return [s for s in spans if s.trace_id in traces]

    def __enter__(self) -> "OtlpReceiver":
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def summary(spans: list[ReceivedSpan]) -> str:
    """The spans as sorted (trace id prefix, name, service, pid) tuples: what an assertion message shows."""
    return json.dumps(sorted({(s.trace_id[:8], s.name, s.service, s.pid) for s in spans}))


def main() -> None:
    parser = argparse.ArgumentParser(description="Print every span a cluster exports over OTLP/HTTP, one per line.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4318, help="OTLP/HTTP's usual port (default 4318)")
    args = parser.parse_args()

    def show(spans: list[ReceivedSpan]) -> None:
        for s in spans:
            job = s.attributes.get("shardyard.job_id", "")
            print(f"trace {s.trace_id}  {s.service:<22} pid {s.pid:<7}  {s.name:<13} {job}", flush=True)

    with OtlpReceiver(args.host, args.port, on_spans=show) as receiver:
        print(f"OTLP traces endpoint: OTEL_EXPORTER_OTLP_ENDPOINT={receiver.endpoint}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends it
            threading.Event().wait()


if __name__ == "__main__":
    main()
