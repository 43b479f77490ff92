"""``shardyard up`` supervises what it started: each service replica, and the broker, killed in turn (each once the
one before is ready again), is started again (``shardyard ps`` shows one restart each: nothing died twice), and a job
submitted afterwards SUCCEEDED. On both brokers:

- the local Apache Kafka keeps its log on disk: killed (``SIGKILL``) and started again, it comes back with every
  record it had acknowledged, the other processes reconnect without a restart, and the job that was running goes on
  (or ends with a typed cause);
- the embedded broker keeps its log in memory and comes back empty: the supervisor creates the topics again and starts
  every other process over, so the job the old log held is forgotten (not shown RUNNING for ever) and the cluster
  carries on on the new log."""

import json
import os
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from shardyard.broker.ports import wait_for_port
from shardyard.cli.cluster import ClusterInfo, get_json
from shardyard.events.reasons import FailureCause
from tests.support.cluster import cli, job, local_cluster, wait_for
from tests.support.events import read_log

pytestmark = [pytest.mark.slow, pytest.mark.broker]

SERVICES_KILLED = ("queue-0", "scheduler-0", "resource-pool-0", "fault-manager-0", "accounting-0", "monitor-0")
KILLED = (*SERVICES_KILLED, "broker")
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture(scope="module", params=["kafka", "embedded"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    options = ("--broker", request.param)
    folder = tmp_path_factory.mktemp(f"supervised-{request.param}")
    with local_cluster(folder, ("A100:1", "A100:1"), replicas=1, options=options) as run_dir:
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


def kill_and_wait(run_dir: Path, name: str) -> None:
    """SIGKILL ``name`` and wait until the supervisor started it again (and, a service, it announced itself)."""
    before = ps(run_dir)[name]
    os.kill(before["pid"], signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        row = ps(run_dir)[name]
        return row if row["running"] and row["pid"] != before["pid"] else None

    again = wait_for(f"{name} started again", restarted, 60, describe=lambda: ps(run_dir))
    assert again["restarts"] == before["restarts"] + 1
    if name != "broker":  # the next kill finds it running, not half-started: it announced itself again
        wait_for(f"{name} ready again", partial(announced, run_dir, name, again["pid"]), 60)
    else:
        host, port = ClusterInfo.load(run_dir).bootstrap.rsplit(":", 1)
        wait_for("the broker listening again", lambda: wait_for_port(host, int(port), 0.5) or None, 60)


def test_each_killed_process_is_restarted_and_a_job_submitted_afterwards_succeeds(cluster: Path) -> None:
    info = ClusterInfo.load(cluster)
    started = cli("submit", "-", run_dir=cluster, stdin=job("before-restarts", max_steps=100_000))
    assert started.returncode == 0, started.stdout + started.stderr
    wait_for("before-restarts running", lambda: jobs(cluster).get("before-restarts") == "RUNNING" or None, 120)
    for name in SERVICES_KILLED:
        kill_and_wait(cluster, name)
    committed = read_log(info.bootstrap)
    kill_and_wait(cluster, "broker")
    if info.broker == "kafka":
        survived_a_durable_broker(cluster, info, committed)
    else:
        started_over_on_an_empty_broker(cluster)
    table = cli("ps", run_dir=cluster).stdout
    print(f"\n{table}")

    done = cli("submit", "-", "--wait", run_dir=cluster, stdin=job("after-restarts", max_steps=30), timeout=300)
    status = cli("status", "after-restarts", "--json", run_dir=cluster)
    assert json.loads(status.stdout)["state"] == "SUCCEEDED", done.stdout + done.stderr + status.stdout

    log = (cluster / "logs" / "supervisor.log").read_text()
    assert all(f"started {name} again" in log for name in KILLED), log


def survived_a_durable_broker(run_dir: Path, info: ClusterInfo, committed: dict[tuple[str, int, int], bytes]) -> None:
    """Apache Kafka came back with its log: every record read before the kill is there, at the same place; no other
    process was started again; the running job is still known, and goes on or ends with a typed cause."""
    after = read_log(info.bootstrap)
    lost = sorted(place for place, value in committed.items() if after.get(place) != value)
    assert not lost, f"{len(lost)} of {len(committed)} records lost or changed by the restart: {lost[:5]}"
    restarts = {name: row["restarts"] for name, row in ps(run_dir).items() if name != "supervisor"}
    assert restarts == {name: int(name in KILLED) for name in restarts}, restarts
    assert "topics were created again" not in (run_dir / "logs" / "supervisor.log").read_text()

    def going_on_or_ended() -> str | None:
        state = jobs(run_dir).get("before-restarts")
        return state if state == "RUNNING" or state in ENDED else None

    state = wait_for("before-restarts running on, or ended", going_on_or_ended, 120, describe=lambda: jobs(run_dir))
    detail = get_json(f"{info.live().monitor_url}/api/jobs/before-restarts")
    if state == "FAILED":
        assert detail["reason"] in {cause.value for cause in FailureCause}, detail
    cancelled = cli("cancel", "before-restarts", "--wait", run_dir=run_dir)  # it trains for long: make room
    assert cancelled.returncode == 0 or state in ENDED, cancelled.stdout + cancelled.stderr


def started_over_on_an_empty_broker(run_dir: Path) -> None:
    """The embedded broker came back empty: every other process was stopped and started again, to rebuild from the
    new log, so the job the old log held is forgotten everywhere (not shown RUNNING for ever) and its shards are
    stopped."""
    started_over = [name for name in ps(run_dir) if name not in ("broker", "supervisor")]
    expected = {"broker": 1} | {name: 1 + (name in KILLED) for name in started_over}

    def restarts() -> dict[str, int]:
        return {name: row["restarts"] for name, row in ps(run_dir).items() if name != "supervisor"}

    wait_for("every process started over", lambda: restarts() == expected or None, 90, describe=restarts)
    wait_for("every process running", lambda: all(r["running"] for r in ps(run_dir).values()) or None, 60)
    wait_for("the forgotten job gone from the monitor", lambda: "before-restarts" not in jobs(run_dir) or None, 60)
    log = (run_dir / "logs" / "supervisor.log").read_text()
    assert "topics were created again" in log

    def ended_in_history() -> dict[str, Any] | None:  # its record is not left RUNNING for ever
        shown = cli("history", "--job", "before-restarts", "-o", "json", run_dir=run_dir)
        rows = json.loads(shown.stdout)["jobs"] if shown.returncode == 0 else []
        return rows[0] if rows and rows[0]["state"] in ENDED else None

    row = wait_for("before-restarts ended in history", ended_in_history, 60, describe=ended_in_history)
    assert (row["state"], row["reason"]) == ("FAILED", FailureCause.BROKER_LOG_LOST.value), row
    assert all(f"stopping {name} (pid" in log for name in started_over), log
