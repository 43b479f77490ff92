"""A job's goodput ledger on a real broker: the lifecycle and shard events of a job that loses a shard, is re-placed
and recomputes what it lost, then succeeds, reach a monitor process through their two topics. It serves the ledger
(each part as computed by hand) on the job's detail, the per-queue counter and ETTR on ``/metrics``, and its
dashboard draws the ledger on the job's page."""

import asyncio
import json
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
    FailureCause,
    JobAccepted,
    JobReady,
    JobRecovering,
    JobRunning,
    JobSucceeded,
    ServiceReady,
)
from tests.support.browser import Dom, browser, render
from tests.support.events import Producer, Watcher, eventually
from tests.support.processes import service
from tests.unit.builders import failed, job_spec, progress, scheduled

pytestmark = pytest.mark.broker
RUN = uuid.uuid4().hex[:6]
"""Ids unique to this run: an outside broker (``SHARDYARD_KAFKA_BOOTSTRAP``) keeps earlier runs' events."""
JOB = f"goodput-{RUN}"
QUEUE = f"team-{RUN}"
EXPECTED = {"queued_s": 5.0, "recovery_s": 5 + 5 + 10 + 10, "recomputed_s": 15.0, "productive_s": 20 + 20}
"""Placed at 5; attempt 1: recovery 5-10, productive 10-30 (until its last step reported; the kill at 32),
recovery 30-35; the wait 35-45 after the fault is recovery; attempt 2: recovery 45-55, recomputed 55-70 (step 30
passed at 70), productive 70-90."""


def story(t0: datetime) -> list[Any]:
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    spec = job_spec(job_id=JOB, queue=QUEUE, submitted_at=t0)
    recovering = JobRecovering(
        occurred_at=at(35),
        job_id=JOB,
        attempt=1,
        cause=FailureCause.KILLED,
        message="killed",
        retry_at=at(35),
        retries_used=1,
        retries_left=2,
    )
    return [
        JobAccepted(occurred_at=t0, job_id=JOB, spec=spec, source_offset=f"s/0/{JOB}"),
        JobReady(occurred_at=t0, job_id=JOB, spec=spec),
        scheduled(JOB, occurred_at=at(5)),
        JobRunning(occurred_at=at(7), job_id=JOB, attempt=1),
        progress(JOB, occurred_at=at(10), step=10),
        progress(JOB, occurred_at=at(20), step=20),
        progress(JOB, occurred_at=at(30), step=30),
        failed(JOB, occurred_at=at(32), cause=FailureCause.KILLED),
        recovering,
        scheduled(JOB, occurred_at=at(45), attempt=2),
        JobRunning(occurred_at=at(47), job_id=JOB, attempt=2),
        progress(JOB, occurred_at=at(55), step=22, attempt=2),
        progress(JOB, occurred_at=at(65), step=26, attempt=2),
        progress(JOB, occurred_at=at(75), step=34, attempt=2),
        JobSucceeded(occurred_at=at(90), job_id=JOB, attempt=2, final_loss=1.0, checkpoint_dir=None),
    ]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


async def test_the_monitor_serves_and_draws_a_jobs_goodput_ledger(
    bootstrap: str, log_dir: Path, tmp_path: Path
) -> None:
    browser()  # fail at once, before the broker work, when there is no browser
    await ensure_topics(bootstrap)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    flags = ["--http-port", str(port), "--instance", f"goodput-monitor-{RUN}"]
    with service("shardyard.monitor", flags, bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="monitor", instance=f"goodput-monitor-{RUN}", timeout_s=60)
            for event in story(datetime.now(UTC) - timedelta(seconds=300)):
                await send.event(event)

            async def ledger() -> dict[str, Any] | None:
                detail = json.loads(await asyncio.to_thread(get, f"{base}/api/jobs/{JOB}"))
                goodput: dict[str, Any] | None = detail.get("goodput")
                done = (
                    detail["state"] == "SUCCEEDED" and goodput and goodput["productive_s"] == EXPECTED["productive_s"]
                )
                return goodput if done else None

            goodput = await eventually(ledger, f"{JOB}'s ledger, ended, with both topics read", 30)
        assert {name: goodput[name] for name in EXPECTED} == EXPECTED
        assert (goodput["total_s"], goodput["notice_s"], goodput["degraded_s"]) == (90.0, 0.0, 0.0)
        assert goodput["ettr"] == pytest.approx(40 / 90, abs=1e-6)

        metrics = (await asyncio.to_thread(get, f"{base}/metrics")).decode().splitlines()
        assert f'shardyard_goodput_seconds_total{{part="recomputed",queue="{QUEUE}"}} 15.0' in metrics
        assert f'shardyard_goodput_ettr{{queue="{QUEUE}"}} {40 / 90}' in metrics

        dom = Dom(render(f"{base}/#job={JOB}", "--dump-dom", tmp_path / "profile"))
    parts = {item["data-part"] for item in dom.find("span", inside="goodput") if "data-part" in item}
    assert parts == {"queued", "recovery", "recomputed", "productive"}
    assert "ETTR 44%" in dom.all_text()
