"""The observability demo (issue 5), in one run of one local cluster: `shardyard up` with its default nodes (two
A100 nodes and a V100 node) and one process per service (nothing here is about failover), every process exporting
traces to an in-process OTLP receiver, and the S15 example job submitted with the CLI. The test sees, in order and
each within a deadline:

1. while the job runs, every S7 metric of it on the monitor's ``/metrics``;
2. while it runs, a node without its shards stopped (``SIGSTOP``): ``NODE_SUSPECT`` fires in ``/api/alerts`` and
   ``shardyard alerts``; restarted (``SIGCONT``): it resolves;
3. the job SUCCEEDED, its loss fallen;
4. its trace: one trace id over at least five processes (CLI, queue, scheduler, two agents, two shards), with the
   placement, rendezvous and every sync;
5. the dashboard in headless Chromium: the nodes, the job and its loss curve; the screenshot is kept as
   ``dashboard.png`` in ``.artefacts/`` (``SHARDYARD_TEST_ARTEFACTS``) with a text record of 1-4 beside it.

The same cluster then shows that a submission without trace headers (kcat's) gets its trace from the queue."""

import asyncio
import contextlib
import io
import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from shardyard.bus.topics import SUBMISSIONS
from shardyard.bus.transport import client_options
from shardyard.cli.cluster import ClusterInfo, get_json
from shardyard.cli.main import main as cli_main
from shardyard.goodput import PARTS
from tests.support.browser import Dom, artefacts, browser, render, screenshot
from tests.support.cluster import cli, job, job_view, local_cluster, speaking_as, wait_for
from tests.support.metrics import missing_s7_metrics
from tests.support.otlp import OtlpReceiver, ReceivedSpan, summary

pytestmark = [pytest.mark.slow, pytest.mark.broker]

JOB = "demo-job"
STEPS, SYNC_INTERVAL = 200, 10
"""The example job, shorter (200 steps, not 300) and syncing every 10 steps rather than 100: the first sync, and
with it every metric, comes early, and the run still outlasts a node's pause on a loaded machine."""
JOB_SPANS = {
    "submit", "admission", "placement", "assignment", "launch", "shard", "rendezvous", "sync", "completion", "goodput"
}  # fmt: skip
"""What a job that runs to success without faults is made of (recovery spans only appear on failures; ``goodput``,
the ended job's ledger, has a child span per stretch of one part, named by the part)."""
SPAN_NAMES = JOB_SPANS | {"re-placement", "recovery-plan"} | {part.value for part in PARTS}
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "REJECTED")


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
    options = ("--anonymous-queue", "default")  # a submission as kcat sends it: unsigned, into the default queue
    with local_cluster(tmp_path_factory.mktemp("demo"), replicas=1, env=otel_env, options=options) as run_dir:
        yield run_dir


# --- 1. metrics ----------------------------------------------------------------------------------------------------


def synced(monitor: str) -> dict[str, Any] | None:
    """The job's view once it runs and every shard has synced at least once (so every S7 metric has a sample)."""
    view = job_view(monitor, JOB)
    shards = view["shards"].values()
    if view["state"] == "RUNNING" and shards and all((s.get("syncs") or 0) >= 1 for s in shards):
        return view
    return None


def scrape(monitor: str) -> str:
    with urllib.request.urlopen(f"{monitor}/metrics", timeout=5) as response:
        return str(response.read().decode())


def every_s7_metric(monitor: str) -> str:
    view = wait_for(f"{JOB} running, every shard past a sync", lambda: synced(monitor), 240)
    assert {p["gpu_model"] for p in view["placements"]} == {"A100"}, view["placements"]
    exposition = ""

    def complete() -> bool:
        nonlocal exposition
        exposition = scrape(monitor)
        return not missing_s7_metrics(exposition, JOB)

    wait_for("every S7 metric on /metrics", complete, 30, lambda: missing_s7_metrics(exposition, JOB))
    shown = "\n".join(line for line in exposition.splitlines() if f'job="{JOB}"' in line)
    return shown


# --- 2. an alert ---------------------------------------------------------------------------------------------------


def idle_node(monitor: str) -> str:
    """A live node that holds none of the job's shards or spares, and no other GPU: stopping it leaves the job be."""
    placed = {p["node_id"] for p in job_view(monitor, JOB)["placements"]}
    nodes = get_json(f"{monitor}/api/nodes")["nodes"]
    idle = [
        n["node_id"] for n in nodes if n["status"] == "ALIVE" and n["node_id"] not in placed and not n["allocated_gpus"]
    ]
    assert idle, f"every node holds a GPU or the job: {placed}"
    return str(idle[0])


def alerts(monitor: str) -> dict[str, Any]:
    found: dict[str, Any] = get_json(f"{monitor}/api/alerts")
    return found


def suspect_firing(monitor: str, node: str) -> dict[str, Any] | None:
    return next((a for a in alerts(monitor)["firing"] if (a["rule"], a["subject"]) == ("NODE_SUSPECT", node)), None)


def back_to_normal(monitor: str, node: str, since: str) -> dict[str, Any] | None:
    """The resolution of the NODE_SUSPECT that fired at ``since``, once the node is ALIVE and no alert fires for it."""
    answer = alerts(monitor)
    status = next(n["status"] for n in get_json(f"{monitor}/api/nodes")["nodes"] if n["node_id"] == node)
    if status != "ALIVE" or any(a["subject"] == node for a in answer["firing"]):
        return None
    wanted = ("alert.resolved", "NODE_SUSPECT", node, since)
    return next((e for e in answer["recent"] if (e["type"], e["rule"], e["subject"], e["since"]) == wanted), None)


def shardyard_alerts(run_dir: Path) -> str:
    """``shardyard alerts``, run in this process: starting another Python (and importing the CLI) takes seconds on
    a loaded machine, and the node must be restarted before it is LOST (10 s)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main(["--run-dir", str(run_dir), "alerts"])
    assert code == 0, out.getvalue()
    return out.getvalue()


def an_alert_fires_and_resolves(run_dir: Path, info: ClusterInfo) -> str:
    monitor = info.monitor_url
    node = idle_node(monitor)
    assert job_view(monitor, JOB)["state"] == "RUNNING"
    os.kill(info.pids[node], signal.SIGSTOP)
    try:
        fired = wait_for(f"NODE_SUSPECT firing for stopped {node}", lambda: suspect_firing(monitor, node), 30)
        firing, _, _ = shardyard_alerts(run_dir).partition("\nrecent:")
        assert re.search(rf"NODE_SUSPECT\s+{node}\b", firing), firing
    finally:
        os.kill(info.pids[node], signal.SIGCONT)
    wait_for(f"{node} restarted, its alerts resolved", lambda: back_to_normal(monitor, node, fired["since"]), 30)
    shown = shardyard_alerts(run_dir)
    firing, _, recent = shown.partition("\nrecent:")
    assert not re.search(rf"\b{node}\b", firing), firing
    assert re.search(rf"FIRING\s+NODE_SUSPECT\s+{node}\b", recent), recent
    assert re.search(rf"RESOLVED\s+NODE_SUSPECT\s+{node}\b", recent), recent
    return f"{node} stopped (SIGSTOP) and restarted (SIGCONT); `shardyard alerts` then:\n{shown}"


# --- 3. the job's end ----------------------------------------------------------------------------------------------


def the_job_succeeds(monitor: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        view = job_view(monitor, JOB)
        return view if view["state"] in TERMINAL else None

    final = wait_for(f"{JOB} to end", ended, 600)
    assert final["state"] == "SUCCEEDED", json.dumps({k: final.get(k) for k in ("state", "reason", "errors")})
    assert final["step"] == STEPS
    assert float(final["final_loss"]) < float(final["first_loss"])
    return final


# --- 4. the trace --------------------------------------------------------------------------------------------------


def one_trace(receiver: OtlpReceiver) -> list[ReceivedSpan]:
    """The job's spans, once every kind has arrived (a shard flushes its last batch as it exits)."""

    def complete() -> bool:
        spans = receiver.job_trace(JOB)
        shard_syncs = {s.pid for s in spans if s.name == "sync"}
        return {s.name for s in spans} >= JOB_SPANS and len(shard_syncs) == 2

    wait_for("every span of the job", complete, 30, lambda: summary(receiver.job_trace(JOB)))
    spans = receiver.job_trace(JOB)
    assert len({s.trace_id for s in spans}) == 1, summary(spans)
    processes = {s.process for s in spans}
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
    assert len(syncs) >= 2 * 3, summary(spans)  # at least three per shard, however much slow syncs widened them
    assert all(ancestors(s)[:3] == ["shard", "launch", "assignment"] for s in syncs), summary(spans)
    assert all("placement" in ancestors(s) and "admission" in ancestors(s) for s in syncs)
    assert {by_id[s.parent_span_id].name for s in spans if s.name == "rendezvous"} == {"shard"}
    assert len({s.pid for s in spans if s.name == "launch"}) == 2  # one agent per shard
    return spans


# --- 5. the dashboard ----------------------------------------------------------------------------------------------


def the_dashboard(monitor: str, profiles: Path) -> Path:
    page = f"{monitor}/#job={JOB}"
    series = get_json(f"{monitor}/api/jobs/{JOB}/series")
    nodes = [n["node_id"] for n in get_json(f"{monitor}/api/nodes")["nodes"]]
    shot = screenshot(page, "dashboard.png", profiles / "shot")
    html = render(page, "--dump-dom", profiles / "dom")
    (artefacts() / "dashboard.html").write_text(html)

    dom = Dom(html)
    for node_id in nodes:
        assert dom.find("div", data_node_id=node_id), f"node {node_id} not drawn"
    assert dom.find("tr", data_job_id=JOB), "the job is missing from the job list"
    assert dom.find("span", id="detail-job-id"), "no job detail"
    points = len(series["step"])
    assert points >= 10, series
    charts = dom.find("svg", id="loss-chart")
    assert charts and charts[0]["data-points"] == str(points)
    (curve,) = dom.find("polyline", inside="loss-chart")
    assert len(curve["points"].split()) == points
    assert dom.find("polyline", inside="rate-chart"), "no throughput curve"
    text = dom.all_text()
    assert JOB in text and "SUCCEEDED" in text and "live · updated" in text
    assert "A100" in text and "V100" in text
    assert "loading…" not in text  # every panel drew
    return shot


@pytest.mark.timeout(900)
def test_one_run_shows_metrics_an_alert_a_trace_and_the_dashboard(
    cluster: Path, receiver: OtlpReceiver, otel_env: dict[str, str], tmp_path: Path
) -> None:
    browser()  # fail at once when there is no browser, before the cluster works for nothing
    info = ClusterInfo.load(cluster)
    monitor = info.monitor_url
    submitted = cli(
        "submit", "-", run_dir=cluster, env=otel_env, stdin=job(JOB, sync_interval=SYNC_INTERVAL, max_steps=STEPS)
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr

    began, at = time.monotonic(), []
    metrics = every_s7_metric(monitor)  # 1
    at.append(time.monotonic() - began)
    alert = an_alert_fires_and_resolves(cluster, info)  # 2
    at.append(time.monotonic() - began)
    final = the_job_succeeds(monitor)  # 3
    at.append(time.monotonic() - began)
    spans = one_trace(receiver)  # 4
    at.append(time.monotonic() - began)
    shot = the_dashboard(monitor, tmp_path)  # 5
    at.append(time.monotonic() - began)

    processes = "\n".join(f"  {service} pid {pid}" for service, pid in sorted({s.process for s in spans}))
    (artefacts() / "observability-demo.txt").write_text(
        f"1. /metrics while {JOB} ran, its own series:\n{metrics}\n\n"
        f"2. {alert}\n\n"
        f"3. {JOB} {final['state']} at step {final['step']}: loss {final['first_loss']:.4f} -> "
        f"{final['final_loss']:.4f}\n\n"
        f"4. trace {spans[0].trace_id}: {len(spans)} spans ({', '.join(sorted({s.name for s in spans}))}) from\n"
        f"{processes}\n\n"
        f"5. the dashboard: {shot}\n\n"
        f"seconds after the submission at which 1-5 were seen: {', '.join(f'{t:.0f}' for t in at)}\n"
    )


def test_a_submission_without_trace_headers_gets_a_trace_from_the_queue(cluster: Path, receiver: OtlpReceiver) -> None:
    job_id = "traced-plain"
    info = ClusterInfo.load(cluster)

    async def produce() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=info.bootstrap, acks="all", enable_idempotence=False, **client_options()
        )
        await producer.start()
        try:
            await producer.send_and_wait(SUBMISSIONS.name, job(job_id, max_steps=30), key=job_id.encode())
        finally:
            await producer.stop()

    with speaking_as(info, info.submitter("default")):  # as kcat would, with the default queue's team's credential
        asyncio.run(produce())

    def complete() -> bool:
        return {"admission", "placement", "sync", "completion"} <= {s.name for s in receiver.job_trace(job_id)}

    def seen() -> str:
        view = job_view(ClusterInfo.load(cluster).monitor_url, job_id)
        state = {k: view.get(k) for k in ("state", "reason", "message", "errors")}
        return f"job {json.dumps(state)}; spans {summary(receiver.job_trace(job_id))}"

    wait_for("the plain submission's trace", complete, 240, seen)
    spans = receiver.job_trace(job_id)
    assert len({s.trace_id for s in spans}) == 1, summary(spans)
    roots = [s for s in spans if not s.parent_span_id]
    assert [(r.name, r.service) for r in roots] == [("admission", "shardyard-queue")], summary(spans)
