"""Traces end to end: a local cluster exporting OTLP to an in-process receiver; one job is one trace, from the CLI's
submission through queue, scheduler, agents and both shard processes to its completion. A plain submission without
trace headers (as kcat sends) gets a trace the queue starts."""

import asyncio
import gzip
import json
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from shardyard.bus.topics import SUBMISSIONS
from shardyard.cli.cluster import ClusterInfo
from shardyard.training.artifacts import create_demo_artifacts
from tests.e2e.test_cli_cluster import EXAMPLE, cli

pytestmark = [pytest.mark.slow, pytest.mark.broker]

JOB_SPANS = {"submit", "admission", "placement", "assignment", "launch", "shard", "rendezvous", "sync", "completion"}
"""What a job that runs to success without faults is made of (recovery spans only appear on failures)."""
SPAN_NAMES = JOB_SPANS | {"re-placement", "recovery-plan"}


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    service: str
    pid: int
    attributes: dict[str, object]


def _value(value: AnyValue) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


class OtlpReceiver:
    """An OTLP/HTTP (protobuf) traces endpoint on a free local port that keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
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

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
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

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def __enter__(self) -> "OtlpReceiver":
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture(scope="module")
def otel_env(receiver: OtlpReceiver) -> dict[str, str]:
    """The environment of the cluster and the CLI: export to the receiver, in batches every 200 ms."""
    inherited = ("OTEL_", "TRACEPARENT", "TRACESTATE")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
    return {
        **clean,
        "PYTHONUNBUFFERED": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, otel_env: dict[str, str]) -> Iterator[Path]:
    run_dir = tmp_path_factory.mktemp("traced")
    create_demo_artifacts(run_dir / "data")
    started = cli("up", "--node", "A100:1", "--node", "A100:1", run_dir=run_dir, env=otel_env, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield run_dir
    finally:
        cli("down", run_dir=run_dir, env=otel_env, timeout=120)


def small_job(task_id: str) -> bytes:
    document = json.loads(json.dumps(EXAMPLE))
    document["task_id"] = task_id
    document["training"] = {"max_steps": 30}
    document["sync_interval"] = 10
    return json.dumps(document).encode()


def job_trace(receiver: OtlpReceiver, job_id: str) -> list[ReceivedSpan]:
    """Every span of the trace(s) that carry ``job_id``."""
    spans = receiver.snapshot()
    traces = {s.trace_id for s in spans if s.attributes.get("shardyard.job_id") == job_id}
    return [s for s in spans if s.trace_id in traces]


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, describe: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout_s:.0f}s: {describe()}")


def summary(spans: list[ReceivedSpan]) -> str:
    return json.dumps(sorted({(s.trace_id[:8], s.name, s.service, s.pid) for s in spans}))


def test_one_job_is_one_trace_across_every_process(
    cluster: Path, receiver: OtlpReceiver, otel_env: dict[str, str]
) -> None:
    job_id = "traced-job"
    submitted = cli("submit", "-", "--wait", run_dir=cluster, env=otel_env, stdin=small_job(job_id), timeout=300)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert "SUCCEEDED" in submitted.stdout, submitted.stdout

    def complete() -> bool:
        names = {s.name for s in job_trace(receiver, job_id)}
        shard_syncs = [s for s in job_trace(receiver, job_id) if s.name == "sync"]
        return names >= JOB_SPANS and len({s.pid for s in shard_syncs}) == 2

    wait_for("every span of the job", complete, 30, lambda: summary(job_trace(receiver, job_id)))
    spans = job_trace(receiver, job_id)
    assert len({s.trace_id for s in spans}) == 1, summary(spans)
    processes = {(s.service, s.pid) for s in spans}
    assert len(processes) >= 5, processes
    services = {s.service for s in spans}
    assert {"shardyard-cli", "shardyard-queue", "shardyard-scheduler", "shardyard-node-agent"} <= services
    assert "shardyard-shard" in services
    assert {s.name for s in spans} <= SPAN_NAMES, "no span per heartbeat or progress report"

    by_id = {s.span_id: s for s in spans}
    roots = [s for s in spans if not s.parent_span_id]
    assert [r.name for r in roots] == ["submit"], summary(spans)
    assert all(s.parent_span_id in by_id for s in spans if s.parent_span_id), "every parent was exported"

    def ancestors(span: ReceivedSpan) -> list[str]:
        names = []
        while span.parent_span_id:
            span = by_id[span.parent_span_id]
            names.append(span.name)
        return names

    syncs = [s for s in spans if s.name == "sync"]
    assert len(syncs) >= 2 * 3  # 30 steps, a sync every 10: three per shard
    assert all(ancestors(s)[:3] == ["shard", "launch", "assignment"] for s in syncs), summary(spans)
    assert all("placement" in ancestors(s) and "admission" in ancestors(s) for s in syncs)
    assert {by_id[s.parent_span_id].name for s in spans if s.name == "rendezvous"} == {"shard"}
    assert len({s.pid for s in spans if s.name == "launch"}) == 2  # one agent per shard


def test_a_submission_without_trace_headers_gets_a_trace_from_the_queue(
    cluster: Path, receiver: OtlpReceiver, otel_env: dict[str, str]
) -> None:
    job_id = "traced-plain"
    bootstrap = ClusterInfo.load(cluster).bootstrap

    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
        await producer.start()
        try:
            await producer.send_and_wait(SUBMISSIONS.name, small_job(job_id), key=job_id.encode())
        finally:
            await producer.stop()

    asyncio.run(produce())

    def complete() -> bool:
        return {"admission", "placement", "sync", "completion"} <= {s.name for s in job_trace(receiver, job_id)}

    wait_for("the plain submission's trace", complete, 240, lambda: summary(job_trace(receiver, job_id)))
    spans = job_trace(receiver, job_id)
    assert len({s.trace_id for s in spans}) == 1, summary(spans)
    roots = [s for s in spans if not s.parent_span_id]
    assert [(r.name, r.service) for r in roots] == [("admission", "shardyard-queue")], summary(spans)
