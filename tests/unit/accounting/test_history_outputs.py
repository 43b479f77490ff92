"""The history's readers without a cluster: the monitor's ``/api/history`` over a SQLite file (no database: 503;
a bad filter: 400; the filters as query parameters), and ``shardyard history``'s table, JSON and CSV, and which
database it reads."""

import csv
import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from shardyard.cli.history import accounting_url
from shardyard.cli.history_render import as_csv, as_json, as_table, as_wide, duration
from shardyard.job_state import JobState
from shardyard.jobdb.record import COLUMNS, LEDGER_COLUMNS
from shardyard.jobdb.store import open_store
from shardyard.jobdb.urls import default_url
from shardyard.monitor.http import build_http
from shardyard.monitor.metrics import MonitorMetrics
from shardyard.monitor.views import ClusterView
from tests.support.accounting import STORIES, expected
from tests.support.clock import FakeClock
from tests.unit.builders import T0, at

RECORDS = [expected(story, f"job-{story}", at(i)) for i, story in enumerate(sorted(STORIES))]


async def test_the_monitor_serves_the_history_with_its_filters(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/accounting.db"
    view = ClusterView()
    async with TestClient(TestServer(build_http(view, MonitorMetrics(view), accounting_url=url))) as client:
        missing = await client.get("/api/history")
        assert missing.status == 503 and "no accounting database at" in (await missing.json())["error"]

        open_store(url, create=True).upsert(RECORDS)  # the accounting service starts after the monitor
        answer = await (await client.get("/api/history")).json()
        assert answer == {"jobs": [r.to_json() for r in sorted(RECORDS, key=lambda r: r.submitted_at, reverse=True)]}
        failed = await (await client.get("/api/history", params={"state": "FAILED"})).json()
        assert [j["job_id"] for j in failed["jobs"]] == ["job-failed"]
        one = await (await client.get("/api/history", params={"job": "job-retried", "since": "2026-01-01"})).json()
        assert [(j["job_id"], j["attempts"], j["final_loss"]) for j in one["jobs"]] == [("job-retried", 2, 0.5)]
        bad = await client.get("/api/history", params={"since": "last tuesday"})
        assert bad.status == 400 and "--since" in (await bad.json())["error"]


async def test_a_monitor_without_a_database_says_so() -> None:
    view = ClusterView()
    async with TestClient(TestServer(build_http(view, MonitorMetrics(view, FakeClock(T0))))) as client:
        answer = await client.get("/api/history")
        assert answer.status == 503 and "--accounting-url" in (await answer.json())["error"]


def test_the_table_json_and_csv_carry_every_record() -> None:
    text = as_table(RECORDS).splitlines()
    assert text[0].split()[:3] == ["JOB", "STATE", "TEAM"] and len(text) == 1 + len(RECORDS)
    retried = next(line for line in text if line.startswith("job-retried"))
    assert retried.split()[1:8] == ["SUCCEEDED", "-", "-", "-", "default", "2", "A100+V100"] and "1h00m" in retried
    signed = replace(RECORDS[0], job_id="job-signed", team="team-a", owner="alice", key_id="k2")
    assert as_table([signed]).splitlines()[1].split()[2:5] == ["team-a", "alice", "k2"]  # TEAM, USER, KEY
    assert "USER_ERROR: exit 1" in next(line for line in text if line.startswith("job-failed"))
    assert json.loads(as_json(RECORDS)) == {"jobs": [r.to_json() for r in RECORDS]}
    rows = list(csv.DictReader(io.StringIO(as_csv(RECORDS))))
    assert list(rows[0]) == list(COLUMNS) and [r["job_id"] for r in rows] == [r.job_id for r in RECORDS]
    cancelled = next(r for r in rows if r["job_id"] == "job-cancelled")
    assert (cancelled["started_at"], cancelled["final_loss"], cancelled["gpu_hours"]) == ("", "", "0.0")
    retried_ettr = f"{RECORDS[2].ettr:.1%}"
    assert RECORDS[2].job_id == "job-retried" and retried_ettr == "96.2%" and retried_ettr in retried
    assert as_table([]) == "no jobs in the accounting database match"
    assert [duration(s) for s in (None, 45, 725, 11_220)] == ["-", "45s", "12m05s", "3h07m"]


def test_history_reads_the_url_given_else_the_environment_else_the_run_folders(tmp_path: Path) -> None:
    given, env = "postgresql://db/jobs", {"SHARDYARD_ACCOUNTING_URL": "sqlite:///elsewhere.db"}
    assert accounting_url(given, tmp_path, env) == given
    assert accounting_url(None, tmp_path, env) == "sqlite:///elsewhere.db"
    assert accounting_url(None, tmp_path, {}) == default_url(tmp_path)
    (tmp_path / "cluster.json").write_text(
        json.dumps(
            {
                "run_dir": str(tmp_path),
                "bootstrap": "b",
                "monitor_url": "",
                "data_root": "",
                "embedded_broker": True,
                "started_at": 0,
                "accounting_url": given,
            }
        )
    )
    assert accounting_url(None, tmp_path, {}) == given  # the running cluster's


def test_the_wide_table_shows_where_each_jobs_time_went() -> None:
    header, *lines = as_wide(RECORDS).splitlines()
    parts = ["QUEUED", "PRODUCTIVE", "RECOVERY", "RECOMPUTED", "NOTICE", "DEGRADED", "STRAGGLER", "REASON"]
    assert header.split()[-len(parts) :] == parts and "ETTR" in header.split()
    retried = next(line for line in lines if line.startswith("job-retried"))
    # the story's ledger: productive 3520 s, recovery 90 s, recomputed 50 s; no queue, notice, degraded placement
    assert retried.split()[-8:-1] == ["0s", "58m40s", "1m30s", "50s", "0s", "0s", "0s"]
    unended: dict[str, Any] = dict.fromkeys(LEDGER_COLUMNS)
    running = replace(RECORDS[3], state=JobState.RUNNING, **unended)
    assert as_wide([running]).splitlines()[1].split()[-8:] == ["-"] * 8  # no ledger before the end, no reason
    assert as_table([running]).splitlines()[1].split()[14] == "-"  # ETTR (SUBMITTED is two words)
