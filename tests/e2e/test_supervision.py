"""``shardyard up`` supervises what it started: each service replica, and the embedded broker, killed in turn (each
once the one before is ready again), is started again (``shardyard ps`` shows one restart each: nothing died
twice), and a job submitted afterwards SUCCEEDED. A broker that comes
back is empty (its log is in memory): the supervisor creates the topics again, and the services and agents carry on
on it."""

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


def test_each_killed_process_is_restarted_and_a_job_submitted_afterwards_succeeds(cluster: Path) -> None:
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
    table = cli("ps", run_dir=cluster).stdout
    print(f"\n{table}")
    assert all(ps(cluster)[name]["restarts"] == 1 for name in KILLED)

    done = cli("submit", "-", "--wait", run_dir=cluster, stdin=job("after-restarts", max_steps=30), timeout=300)
    status = cli("status", "after-restarts", "--json", run_dir=cluster)
    assert json.loads(status.stdout)["state"] == "SUCCEEDED", done.stdout + done.stderr + status.stdout

    log = (cluster / "logs" / "supervisor.log").read_text()
    assert all(f"started {name} again" in log for name in KILLED), log
    assert "topics were created again" in log
