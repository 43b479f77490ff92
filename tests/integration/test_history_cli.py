"""``shardyard history`` reads the accounting database itself: jobs a real accounting process wrote from a real
broker are listed as a table, JSON and CSV, filtered by ``--state``, ``--job`` and ``--since``, after that broker and
every process are gone; and the dashboard's history view, in a real browser, shows what the monitor's
``/api/history`` reads from the same database."""

import csv
import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from shardyard.broker.ports import free_port
from shardyard.broker.process import BrokerProcess
from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import SERVICES
from shardyard.events import ServiceReady
from shardyard.jobdb.query import HistoryQuery
from shardyard.jobdb.store import open_store
from shardyard.jobdb.urls import default_url
from tests.support.accounting import STORIES, expected
from tests.support.broker import own_broker
from tests.support.browser import Dom, browser, render
from tests.support.events import Producer, Watcher
from tests.support.processes import service
from tests.support.wait import eventually
from tests.unit.builders import at

pytestmark = pytest.mark.broker
RUN = uuid.uuid4().hex[:6]


def history(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "SHARDYARD_ACCOUNTING_URL"}
    command = [sys.executable, "-m", "shardyard.cli.main", "--run-dir", str(run_dir), "history", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture
def own(log_dir: Path, broker_kind: str) -> BrokerProcess:
    """A broker of this test's own, not started: the test stops it."""
    return own_broker("kafka" if broker_kind == "external" else broker_kind, log_dir)


async def test_history_answers_after_the_broker_is_gone(tmp_path: Path, log_dir: Path, own: BrokerProcess) -> None:
    run_dir = tmp_path / "run"
    url = default_url(run_dir)  # where `shardyard up` has its accounting service write
    jobs = {story: f"hist-{story}-{RUN}" for story in sorted(STORIES)}
    with own as broker:  # stopped at the end of the block: what follows runs without it
        await ensure_topics(broker.bootstrap)
        flags = ["--instance", f"hist-{RUN}", "--accounting-url", url]
        with service("shardyard.accounting", flags, bootstrap=broker.bootstrap, log_dir=log_dir):
            async with Watcher(broker.bootstrap, [SERVICES]) as watch, Producer(broker.bootstrap) as send:
                await watch.first(ServiceReady, service="accounting", timeout_s=60)
                for i, story in enumerate(sorted(STORIES)):
                    for event in STORIES[story](jobs[story], at(i)):
                        await send.event(event)

                def ended() -> bool:
                    found = open_store(url, create=False).select(HistoryQuery())
                    return sum(1 for r in found if r.ended_at is not None) == len(STORIES)

                assert await eventually(ended, "every job ended in the database", 30)
    # No broker, no service: only the file.

    listed = history(run_dir, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    want = [expected(s, jobs[s], at(i)).to_json() for i, s in enumerate(sorted(STORIES))]
    assert json.loads(listed.stdout) == {"jobs": want[::-1]}  # newest submission first

    failed = history(run_dir, "--state", "failed", "-o", "csv")
    assert failed.returncode == 0, failed.stderr
    [row] = list(csv.DictReader(io.StringIO(failed.stdout)))
    assert (row["job_id"], row["reason"], row["message"], row["gpu_hours"]) == (
        jobs["failed"],
        "USER_ERROR",
        "exit 1",
        "1.0",
    )

    one = history(run_dir, "--job", jobs["retried"])
    assert one.returncode == 0, one.stderr
    header, line = one.stdout.splitlines()
    assert header.split()[:5] == ["JOB", "STATE", "TEAM", "USER", "KEY"]
    # No team, no signer, no key: the story's events carry none.
    assert line.split()[:8] == [jobs["retried"], "SUCCEEDED", "-", "-", "-", "default", "2", "A100+V100"]
    assert "0.5000" in line

    # Since 2 s after the cancelled job ended (t=0+30): it is the one left out.
    since = history(run_dir, "--since", at(32).isoformat(), "-o", "json")
    assert {j["job_id"] for j in json.loads(since.stdout)["jobs"]} == set(jobs.values()) - {jobs["cancelled"]}

    bad = history(run_dir, "--state", "DONE")
    assert bad.returncode == 2 and "--state is one of" in bad.stderr
    nowhere = history(tmp_path / "elsewhere")
    assert nowhere.returncode == 2 and "no accounting database at" in nowhere.stderr


@pytest.mark.slow
async def test_the_dashboard_shows_the_history(bootstrap: str, log_dir: Path, tmp_path: Path) -> None:
    browser()  # fail at once when there is no browser
    await ensure_topics(bootstrap)
    url = f"sqlite://{tmp_path}/accounting.db"
    records = [expected(s, f"dash-{s}-{RUN}", at(i)) for i, s in enumerate(sorted(STORIES))]
    open_store(url, create=True).upsert(records)
    port = free_port()
    flags = ["--http-port", str(port), "--instance", f"hist-monitor-{RUN}", "--accounting-url", url]
    with service("shardyard.monitor", flags, bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [SERVICES]) as watch:
            await watch.first(ServiceReady, service="monitor", instance=f"hist-monitor-{RUN}", timeout_s=60)
        dom = Dom(render(f"http://127.0.0.1:{port}/", "--dump-dom", tmp_path / "profile"))
    shown = {row["data-history-job"]: row for row in dom.find("tr", inside="history") if "data-history-job" in row}
    assert set(shown) == {r.job_id for r in records}
    assert shown[f"dash-failed-{RUN}"]["data-state"] == "FAILED"
    text = dom.all_text()
    assert (
        "History (accounting)" in text and "USER_ERROR: exit 1" in text and "2 \u00d7 A100+V100" in text
    )  # the GPU count times the model
