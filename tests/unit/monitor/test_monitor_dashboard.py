"""What the dashboard reads: a job's bounded progress series, the cluster summary, and the page served with them."""

from __future__ import annotations

from itertools import pairwise

import pytest
from aiohttp.test_utils import TestClient, TestServer

from shardyard.events import GpuStatus, JobAccepted, JobReady, NodeStatus
from shardyard.monitor.http import build_http, dashboard_files
from shardyard.monitor.jobs import ProgressSeries
from shardyard.monitor.metrics import MonitorMetrics
from shardyard.monitor.views import ClusterView
from tests.unit.builders import GIB, at, job_spec, node_state, progress, scheduled, started


def point(step: int, loss: float = 1.0) -> tuple[int, float, float, float]:
    return (step, float(step), loss, 10.0)


def series_of(steps: list[int], limit: int = 8) -> ProgressSeries:
    series = ProgressSeries(limit=limit)
    for step in steps:
        series.add(point(step))
    return series


def test_a_short_run_keeps_every_report() -> None:
    columns = series_of([1, 2, 3]).columns()
    assert columns == {
        "stride": 1,
        "step": [1, 2, 3],
        "t_s": [1.0, 2.0, 3.0],
        "loss": [1.0, 1.0, 1.0],
        "samples_per_s": [10.0, 10.0, 10.0],
    }


def test_an_empty_series_has_empty_columns() -> None:
    assert ProgressSeries().columns() == {"stride": 1, "step": [], "t_s": [], "loss": [], "samples_per_s": []}


@pytest.mark.parametrize("reports", [8, 9, 100, 1000], ids=["just-full", "one-past", "long", "very-long"])
def test_a_long_run_keeps_its_whole_shape_within_the_bound(reports: int) -> None:
    steps = list(range(1, reports + 1))
    columns = series_of(steps, limit=8).columns()

    assert len(columns["step"]) <= 8 + 1  # the bound, plus the newest report shown apart
    assert columns["step"][0] == 1  # the start of the curve is never dropped
    assert columns["step"][-1] == reports  # and it ends where the job is
    assert columns["step"] == sorted(columns["step"])
    assert len(columns["step"]) >= 4  # halving never leaves the chart bare


def test_points_stay_evenly_spaced_after_halving() -> None:
    columns = series_of(list(range(0, 64)), limit=8).columns()
    kept = columns["step"][:-1]
    assert {b - a for a, b in pairwise(kept)} == {columns["stride"]}


def test_a_resumed_gang_drops_the_points_of_lost_work() -> None:
    columns = series_of([10, 20, 30, 40, 25, 30], limit=100).columns()
    assert columns["step"] == [10, 20, 25, 30]


def test_a_diverged_loss_is_null_not_nan() -> None:
    series = ProgressSeries()
    series.add((1, 0.0, float("nan"), float("inf")))
    assert series.columns()["loss"] == [None] and series.columns()["samples_per_s"] == [None]


JOB = "job-1"
SPEC = job_spec(job_id=JOB, max_steps=40)


def running_job(attempt: int = 1) -> ClusterView:
    view = ClusterView()
    for event in (
        JobAccepted(occurred_at=at(0), job_id=JOB, spec=SPEC, source_offset="s/0/0"),
        JobReady(occurred_at=at(0), job_id=JOB, spec=SPEC),
        scheduled(JOB, "node-a", "node-b", attempt=attempt, occurred_at=at(1)),
        started(JOB, 0, attempt=attempt, occurred_at=at(2)),
        started(JOB, 1, attempt=attempt, node_id="node-b", occurred_at=at(2)),
    ):
        view.apply(event)
    return view


def test_rank_0_reports_make_the_series_with_the_gangs_throughput() -> None:
    view = running_job()
    view.apply(progress(JOB, 0, step=5, loss=4.0, samples_per_s=100.0, occurred_at=at(10)))
    view.apply(progress(JOB, 1, node_id="node-b", step=5, loss=4.1, samples_per_s=90.0, occurred_at=at(10.2)))
    view.apply(progress(JOB, 0, step=10, loss=3.0, samples_per_s=110.0, occurred_at=at(12.5)))

    series = view.jobs[JOB].series_json()

    assert (series["job_id"], series["state"], series["max_steps"]) == (JOB, "SCHEDULED", 40)
    assert series["step"] == [5, 10]  # rank 1's report adds no point: rank 0 speaks for the averaged model
    assert series["loss"] == [4.0, 3.0]
    assert series["t_s"] == [0.0, 2.5]  # seconds since the job's first step
    assert series["samples_per_s"] == [100.0, 200.0]  # the whole gang: rank 0's 110 plus rank 1's last 90


def test_an_older_attempts_report_adds_nothing() -> None:
    view = running_job(attempt=2)
    view.apply(progress(JOB, 0, step=5, attempt=1, occurred_at=at(6)))  # a late report of the failed attempt
    assert view.jobs[JOB].series_json()["step"] == []


def test_the_summary_counts_nodes_gpus_and_jobs() -> None:
    view = running_job()
    busy = (
        GpuStatus(index=0, model="A100", tflops=35, memory_bytes=80 * GIB, utilization=0.8),
        GpuStatus(index=1, model="A100", tflops=35, memory_bytes=80 * GIB, utilization=0.2, healthy=False),
    )
    view.apply(node_state("node-a", gpus=busy, allocated_gpus=(0,), draining=True))
    view.apply(node_state("node-b", status=NodeStatus.LOST, gpus=()))

    summary = view.summary_json()

    assert summary["nodes"] == {"ALIVE": 1, "SUSPECT": 0, "LOST": 1}
    assert (summary["draining"], summary["gpus"], summary["gpus_allocated"], summary["gpus_unhealthy"]) == (1, 2, 1, 1)
    assert summary["gpu_utilization"] == pytest.approx(0.5)
    assert summary["jobs"]["SCHEDULED"] == 1 and summary["active_jobs"] == 1


def test_the_summary_of_an_empty_cluster_has_no_utilisation() -> None:
    summary = ClusterView().summary_json()
    assert (summary["gpus"], summary["gpu_utilization"], summary["active_jobs"]) == (0, None, 0)


def test_the_dashboard_ships_in_the_package() -> None:
    files = dashboard_files()
    assert b'src="static/dashboard.js"' in files["dashboard.html"]
    assert b"api/jobs" in files["dashboard.js"]
    assert b"http://" not in files["dashboard.html"] + files["dashboard.js"].replace(b"http://www.w3.org", b"")


async def test_the_monitor_serves_the_page_its_script_and_the_series() -> None:
    view = running_job()
    view.apply(progress(JOB, 0, step=5, loss=4.0, occurred_at=at(10)))
    async with TestClient(TestServer(build_http(view, MonitorMetrics(view)))) as client:
        page = await client.get("/")
        assert page.status == 200 and page.content_type == "text/html"
        assert "<title>Shardyard</title>" in await page.text()
        script = await client.get("/static/dashboard.js")
        assert script.status == 200 and script.content_type == "text/javascript"
        series = await client.get(f"/api/jobs/{JOB}/series")
        assert (await series.json())["loss"] == [4.0]
        assert (await client.get("/api/jobs/nobody/series")).status == 404
        summary = await (await client.get("/api/summary")).json()
        assert summary["jobs"]["SCHEDULED"] == 1


async def test_cluster_wide_answers_are_kept_until_the_view_changes() -> None:
    view = running_job()
    view.apply(node_state("node-a"))
    metrics = MonitorMetrics(view)
    async with TestClient(TestServer(build_http(view, metrics))) as client:
        first = await (await client.get("/metrics")).read()
        assert first == metrics.exposition()
        metrics.events.labels("t").inc()  # a change the view does not count: the kept answer is served
        assert await (await client.get("/metrics")).read() == first
        nodes = await (await client.get("/api/nodes")).json()

        view.apply(node_state("node-b", draining=True))
        view.apply(progress(JOB, 0, step=5, loss=float("nan"), occurred_at=at(10)))

        assert await (await client.get("/metrics")).read() == metrics.exposition() != first
        (node_a,) = nodes["nodes"]
        assert (node_a["node_id"], node_a["status"], node_a["artifact_count"]) == ("node-a", "ALIVE", 2)
        shown = await (await client.get("/api/nodes")).json()
        assert [(n["node_id"], n["draining"]) for n in shown["nodes"]] == [("node-a", False), ("node-b", True)]
        jobs = await (await client.get("/api/jobs")).json()
        assert jobs["jobs"][0]["loss"] is None  # a diverged run's NaN: JSON has no such number
