"""The dashboard following a live job, in a real browser: a monitor process on a real broker is fed node states and a
job's run step by step, and headless Chromium renders its page while the job runs (every point of its loss curve,
its GPUs in use) and again once it has ended. The page over a whole real cluster, and its screenshot, are the
observability demo's (``test_observability_demo.py``)."""

import asyncio
import json
import math
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shardyard.broker.ports import free_port
from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import SERVICES
from shardyard.events import (
    FieldError,
    GpuStatus,
    JobAccepted,
    JobReady,
    JobRejected,
    JobRunning,
    JobSucceeded,
    JobUnschedulable,
    PendingReason,
    RejectReason,
    ServiceReady,
)
from tests.support.browser import Dom, browser, render
from tests.support.events import Producer, Watcher, eventually
from tests.support.processes import service
from tests.unit.builders import GIB, completed, job_spec, node_state, progress, scheduled, started

pytestmark = [pytest.mark.slow, pytest.mark.broker]
RUN = uuid.uuid4().hex[:6]
"""Ids unique to this run: an outside broker (``SHARDYARD_KAFKA_BOOTSTRAP``) keeps earlier runs' events."""
JOB = f"dash-job-{RUN}"
WAITING = f"dash-waiting-{RUN}"
NODES = (f"dash-a-{RUN}", f"dash-b-{RUN}")
STEPS = 40
"""Progress reports per shard: the loss curve must carry them all."""


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def shown_time(at: datetime) -> str:
    """``at`` as the dashboard shows an estimated start (``hhmm`` of ``dom.js``) in the browser's zone, ours: the time
    of day, after the day where that is not today."""
    local = at.astimezone()
    if local.date() == datetime.now().astimezone().date():
        return f"{local:%H:%M}"
    return f"{local:%a} {local.day} {local:%b %H:%M}"


def gpus(node: int) -> tuple[GpuStatus, ...]:
    return tuple(
        GpuStatus(
            index=i,
            model="A100",
            tflops=35,
            memory_bytes=80 * GIB,
            memory_used_bytes=(20 + 30 * i) * GIB,
            utilization=0.9 - 0.5 * i,
            temperature_c=55 + 10 * i + node,
            simulated=True,
        )
        for i in range(2)
    )


async def publish_run(send: Producer, start: datetime) -> None:
    """Two nodes, then a 2-shard job from acceptance to RUNNING and STEPS reports per shard of a falling loss."""
    for n, node_id in enumerate(NODES):
        await send.event(
            node_state(
                node_id,
                occurred_at=start,
                last_heartbeat_at=start,
                gpus=gpus(n),
                allocated_gpus=(n,),  # shard n's GPU, as ``scheduled`` places it
                cpu_load=0.2 + 0.2 * n,
                topology={"zone": "z1", "rack": f"r{n}"},
            )
        )
    spec = job_spec(job_id=JOB, gpu_count=2, max_steps=STEPS * 5, priority=5, submitted_at=start)
    for event in (
        JobAccepted(occurred_at=start, job_id=JOB, spec=spec, source_offset=f"dash/0/{RUN}"),
        JobReady(occurred_at=start, job_id=JOB, spec=spec),
        scheduled(JOB, *NODES, occurred_at=start),
        *(started(JOB, i, node_id=node, occurred_at=start) for i, node in enumerate(NODES)),
        JobRunning(occurred_at=start, job_id=JOB, attempt=1),
    ):
        await send.event(event)
    for k in range(1, STEPS + 1):
        at = start + timedelta(seconds=0.5 * k)
        loss = 1.0 + 3.0 * math.exp(-k / 12)
        for i, node in enumerate(NODES):
            await send.event(
                progress(
                    JOB,
                    i,
                    node_id=node,
                    step=5 * k,
                    loss=loss + 0.01 * i,
                    samples_per_s=120.0,
                    occurred_at=at,
                    step_ms=250.0,
                    compute_ms=100.0 + 100.0 * i,  # rank 1 takes twice rank 0's own time a step
                )
            )


async def test_the_dashboard_renders_the_cluster_and_a_live_job(bootstrap: str, log_dir: Path, tmp_path: Path) -> None:
    browser()  # fail at once, before the broker work, when there is no browser
    await ensure_topics(bootstrap)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    page = f"{base}/#job={JOB}"
    start = datetime.now(UTC) - timedelta(seconds=0.5 * STEPS)  # the last report is about now
    with service("shardyard.monitor", ["--http-port", str(port)], bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="monitor", timeout_s=60)
            await publish_run(send, start)

            async def curve_complete() -> bool:
                series = await asyncio.to_thread(get, f"{base}/api/jobs/{JOB}/series")
                nodes = await asyncio.to_thread(get, f"{base}/api/nodes")
                shown = {n["node_id"] for n in nodes["nodes"]}
                return len(series["step"]) == STEPS and set(NODES) <= shown and series["state"] == "RUNNING"

            await eventually(curve_complete, f"every node and all {STEPS} points of {JOB}'s curve")

            dom = Dom(render(page, "--dump-dom", tmp_path / "profile-dom"))
            for node_id in NODES:
                assert dom.find("div", data_node_id=node_id), f"node {node_id} not drawn"
            assert dom.find("tr", data_job_id=JOB), "the job is missing from the job list"
            assert dom.find("span", id="detail-job-id"), "no job detail"
            charts = dom.find("svg", id="loss-chart")
            assert charts and charts[0]["data-points"] == str(STEPS)
            (curve,) = dom.find("polyline", inside="loss-chart")
            assert len(curve["points"].split()) == STEPS
            assert dom.find("polyline", inside="rate-chart"), "no throughput curve"
            text = dom.all_text()
            assert JOB in text and "RUNNING" in text and "live · updated" in text
            assert "A100" in text and "in use" in text
            assert "loading…" not in text  # every panel drew, alerts too (firing, none, or not served yet)
            # Per-rank step times: the gang's step and each rank's own time, the straggler's marked with its ratio.
            assert "own time" in text and "250 ms" in text and "200 ms (2.00x)" in text, text[-3000:]
            rows = dom.find("tr", data_queue="default")  # the queues panel: the job's queue, its A100s in use
            assert rows and rows[0]["data-model"] == "A100", rows

            # A job waiting on capacity shows when it is expected to start: about then (p50), and by when (p90).
            expected = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
            likely = expected + timedelta(minutes=45)
            waiting = job_spec(job_id=WAITING, gpu_count=2, priority=1, submitted_at=start)
            await send.event(
                JobAccepted(occurred_at=start, job_id=WAITING, spec=waiting, source_offset=f"dash/1/{RUN}")
            )
            await send.event(JobReady(occurred_at=start, job_id=WAITING, spec=waiting))
            await send.event(
                JobUnschedulable(
                    occurred_at=datetime.now(UTC),
                    job_id=WAITING,
                    reason=PendingReason.INSUFFICIENT_GPUS,
                    message="0/2 nodes can take the gang of 2 x A100: 2 no free GPU",
                    estimated_start=expected,
                    estimated_start_p90=likely,
                )
            )

            async def estimated() -> bool:
                job = await asyncio.to_thread(get, f"{base}/api/jobs/{WAITING}")
                return bool(job and job.get("estimated_start") and job.get("estimated_start_p90"))

            await eventually(estimated, f"{WAITING}'s estimated start")
            shown = Dom(render(f"{base}/#job={WAITING}", "--dump-dom", tmp_path / "profile-wait")).all_text()
            hhmm = [shown_time(at) for at in (expected, likely)]
            assert f"starts ~{hhmm[0]}, 90 % by {hhmm[1]}" in shown and "INSUFFICIENT_GPUS" in shown, shown[-3000:]

            # Job-supplied text is shown as text: markup in a rejected submission's message and fields runs nothing.
            evil = f"dash-evil-{RUN}"
            markup = '<img src=x onerror="document.title=1"><script>document.title=2</script>\x1b[2J'
            await send.event(
                JobRejected(
                    occurred_at=datetime.now(UTC),
                    job_id=evil,
                    reason=RejectReason.INVALID_VALUE,
                    message=f"invalid submission: task_type: {markup}",
                    errors=(FieldError(field="task_type", problem="too long", input=markup),),
                    source_offset=f"dash/2/{RUN}",
                )
            )
            await eventually(
                lambda: asyncio.to_thread(lambda: get(f"{base}/api/jobs")["counts"]["REJECTED"] == 1), "the rejection"
            )
            inert = Dom(render(f"{base}/#job={evil}", "--dump-dom", tmp_path / "profile-evil"))
            assert not [img for img in inert.find("img") if img.get("src") == "x"], (
                "markup from a job became an element"
            )
            assert not inert.find("script", inside="job-detail") and not inert.find("script", inside="jobs")
            assert '<img src=x onerror="document.title=1">' in inert.all_text()  # shown, as text

            # The page follows the job to its end.
            end = datetime.now(UTC)
            for i, node in enumerate(NODES):
                await send.event(completed(JOB, i, node_id=node, final_loss=1.2, occurred_at=end))
            await send.event(
                JobSucceeded(occurred_at=end, job_id=JOB, attempt=1, final_loss=1.2, checkpoint_dir=f"/ckpt/{JOB}")
            )

            async def succeeded() -> bool:
                return bool((await asyncio.to_thread(get, f"{base}/api/jobs/{JOB}"))["state"] == "SUCCEEDED")

            await eventually(succeeded, f"{JOB} SUCCEEDED")
            ended = Dom(render(page, "--dump-dom", tmp_path / "profile-end")).all_text()
            assert "SUCCEEDED" in ended and "succeeded" in ended  # the badge, and the timeline's entry
