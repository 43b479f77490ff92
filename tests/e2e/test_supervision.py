"""``shardyard up`` supervises what it started: each service replica, and the embedded broker, killed in turn (each
once the one before is ready again), is started again (``shardyard ps`` shows one restart each: nothing died
twice), and a job submitted afterwards SUCCEEDED. A broker that comes
back is empty (its log is in memory): the supervisor creates the topics again and starts every other process over,
so the job the old log held is forgotten (not shown RUNNING for ever) and the cluster carries on on the new log."""

import json
import os
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from shardyard.cli.cluster import ClusterInfo, get_json
from tests.support.cluster import cli, job, local_cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.broker]

KILLED = ("queue-0", "scheduler-0", "resource-pool-0", "fault-manager-0", "accounting-0", "monitor-0", "broker")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with local_cluster(tmp_path_factory.mktemp("supervised"), ("A100:1", "A100:1"), replicas=1) as run_dir:
        yield run_dir


def ps(run_dir: Path) -> dict[str, dict[str, Any]]:
    shown = cli("ps", "-o", "json", run_dir=run_dir)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    return {row["name"]: row for row in json.loads(shown.stdout)}


def announced(run_dir: Path, name: str, pid: int) -> bool:
    """Whether the monitor lists ``name`` ready under ``pid`` (its subscribers run)."""
    info = ClusterInfo.load(run_dir).live()
    services = get_json(f"{info.monitor_url}/api/services", timeout_s=2)["services"]
    return any(s["instance"] == name and s["pid"] == pid for s in services)


def jobs(run_dir: Path) -> dict[str, str]:
    """Job id -> state, as the monitor lists them."""
    shown = cli("jobs", "-o", "json", run_dir=run_dir)
    return {j["job_id"]: j["state"] for j in json.loads(shown.stdout)["jobs"]} if shown.returncode == 0 else {}


def test_each_killed_process_is_restarted_and_a_job_submitted_afterwards_succeeds(cluster: Path) -> None:
    started = cli("submit", "-", run_dir=cluster, stdin=job("before-restarts", max_steps=100_000))
    assert started.returncode == 0, started.stdout + started.stderr
    wait_for("before-restarts running", lambda: jobs(cluster).get("before-restarts") == "RUNNING" or None, 120)
    for name in KILLED:
        before = ps(cluster)[name]
        os.kill(before["pid"], signal.SIGKILL)

        def restarted(name: str = name, pid: int = before["pid"]) -> dict[str, Any] | None:
            row = ps(cluster)[name]
            return row if row["running"] and row["pid"] != pid else None

        again = wait_for(f"{name} started again", restarted, 60, describe=lambda: ps(cluster))
        assert again["restarts"] == before["restarts"] + 1
        if name != "broker":  # the next kill finds it running, not half-started: it announced itself again
            wait_for(f"{name} ready again", partial(announced, cluster, name, again["pid"]), 60)
    # The broker came back empty: every other process was stopped and started again, to rebuild from the new log,
    # so the job the old log held is forgotten everywhere (not shown RUNNING for ever) and its shards are stopped.
    started_over = [name for name in ps(cluster) if name not in ("broker", "supervisor")]
    expected = {"broker": 1} | {name: 1 + (name in KILLED) for name in started_over}

    def restarts() -> dict[str, int]:
        return {name: row["restarts"] for name, row in ps(cluster).items() if name != "supervisor"}

    wait_for("every process started over", lambda: restarts() == expected or None, 90, describe=restarts)
    wait_for("every process running", lambda: all(r["running"] for r in ps(cluster).values()) or None, 60)
    wait_for("the forgotten job gone from the monitor", lambda: "before-restarts" not in jobs(cluster) or None, 60)
    table = cli("ps", run_dir=cluster).stdout
    print(f"\n{table}")

    done = cli("submit", "-", "--wait", run_dir=cluster, stdin=job("after-restarts", max_steps=30), timeout=300)
    status = cli("status", "after-restarts", "--json", run_dir=cluster)
    assert json.loads(status.stdout)["state"] == "SUCCEEDED", done.stdout + done.stderr + status.stdout

    log = (cluster / "logs" / "supervisor.log").read_text()
    assert all(f"started {name} again" in log for name in KILLED), log
    assert "topics were created again" in log
    assert all(f"stopping {name} (pid" in log for name in started_over), log
