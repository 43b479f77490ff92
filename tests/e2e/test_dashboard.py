"""The dashboard in a real browser: a monitor process on a real broker is fed node states and a job's whole run, and
headless Chromium renders its page. The DOM must show the nodes, the job and its loss curve; the screenshot is kept as
a test artefact (``SHARDYARD_TEST_ARTEFACTS``, default ``.artefacts/``) for a person to look at."""

import asyncio
import json
import math
import os
import shutil
import subprocess
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import SERVICES
from shardyard.embedded import free_port
from shardyard.events import GpuStatus, JobAccepted, JobReady, JobRunning, JobSucceeded, ServiceReady
from tests.support.events import Producer, Watcher, eventually
from tests.support.processes import service
from tests.unit.builders import GIB, completed, job_spec, node_state, progress, scheduled, started

pytestmark = [pytest.mark.slow, pytest.mark.broker]
ROOT = Path(__file__).parents[2]
RUN = uuid.uuid4().hex[:6]
"""Ids unique to this run: an outside broker (``SHARDYARD_KAFKA_BOOTSTRAP``) keeps earlier runs' events."""
JOB = f"dash-job-{RUN}"
NODES = (f"dash-a-{RUN}", f"dash-b-{RUN}")
STEPS = 40
"""Progress reports per shard: the loss curve must carry them all."""
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"})


def browser() -> str:
    """Chromium's path. Missing, the test fails rather than skips: a skipped browser test would pass CI unseen."""
    for name in BROWSER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "no Chromium on PATH (tried " + ", ".join(BROWSER_NAMES) + "): the dashboard test renders the page in a real "
        "browser. Install the Debian package `chromium` (`./dev setup` does when apt-get is available).",
        pytrace=False,
    )


def artefacts() -> Path:
    folder = Path(os.environ.get("SHARDYARD_TEST_ARTEFACTS") or ROOT / ".artefacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def render(url: str, mode: str, profile: Path) -> str:
    """Load ``url`` headless and give the page 4 s of virtual time (about four polls of the API); Chromium waits for
    the page's fetches before it lets that time run, so the budget costs no wall time waiting on the monitor."""
    command = [
        browser(),
        "--headless",
        "--disable-gpu",
        "--no-sandbox",  # tests run as root in CI containers
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
        "--virtual-time-budget=4000",
        mode,
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


class Dom(HTMLParser):
    """The dumped DOM as a flat list of (tag, attributes, ids of the open ancestors), and its visible text."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], tuple[str, ...]]] = []
        self.text: list[str] = []
        self._open: list[tuple[str, str]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {name: value or "" for name, value in attrs}
        self.elements.append((tag, found, tuple(i for _, i in self._open if i)))
        if tag not in VOID:
            self._open.append((tag, found.get("id", "")))

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        if not self._open or self._open[-1][0] not in ("style", "script"):
            self.text.append(data)

    def find(self, tag: str, *, inside: str | None = None, **attrs: str) -> list[dict[str, str]]:
        return [
            found
            for name, found, ancestors in self.elements
            if name == tag
            and (inside is None or inside in ancestors)
            and all(found.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]

    def all_text(self) -> str:
        return " ".join(" ".join(self.text).split())


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


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
                progress(JOB, i, node_id=node, step=5 * k, loss=loss + 0.01 * i, samples_per_s=120.0, occurred_at=at)
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

            folder = artefacts()
            screenshot = folder / "dashboard.png"
            screenshot.unlink(missing_ok=True)
            render(page, f"--screenshot={screenshot}", tmp_path / "profile-shot")
            html = render(page, "--dump-dom", tmp_path / "profile-dom")
            (folder / "dashboard.html").write_text(html)

            dom = Dom(html)
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

            assert screenshot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
            assert screenshot.stat().st_size > 30_000, "the screenshot looks blank"

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
