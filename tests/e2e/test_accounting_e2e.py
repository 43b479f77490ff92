"""Job accounting on a whole local cluster: ``shardyard up`` starts the accounting service beside the others and
hands it and the monitor the run folder's database; a job trained to its end is recorded with rank 0's final loss,
served by the monitor's ``/api/history``, listed by ``shardyard history`` after ``shardyard down``, and still there
after a later ``shardyard up``, whose new embedded broker remembers nothing of it. Both back ends: the run folder's
SQLite file by default, and a throw-away PostgreSQL server named by ``SHARDYARD_ACCOUNTING_URL``."""

import getpass
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardyard.cli.cluster import ClusterInfo, get_json
from shardyard.jobdb.urls import default_url
from tests.support.cluster import cli, job, local_cluster, wait_for
from tests.support.postgres import throwaway_postgres

pytestmark = [pytest.mark.slow, pytest.mark.broker]
JOB = "accounting-e2e"
ENV = {k: v for k, v in os.environ.items() if k != "SHARDYARD_ACCOUNTING_URL"} | {"PYTHONUNBUFFERED": "1"}


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The accounting URL the cluster is given (None: the run folder's SQLite file, ``up``'s default)."""
    if request.param == "sqlite":
        yield None
        return
    with throwaway_postgres() as url:
        yield url


def history(run_dir: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    shown = cli("history", "--job", JOB, "-o", "json", run_dir=run_dir, env=env)
    assert shown.returncode == 0, shown.stderr
    jobs: list[dict[str, Any]] = json.loads(shown.stdout)["jobs"]
    return jobs


def test_a_jobs_record_outlives_the_cluster(tmp_path: Path, database: str | None) -> None:
    run_dir = tmp_path / "run"
    env = ENV if database is None else ENV | {"SHARDYARD_ACCOUNTING_URL": database}
    with local_cluster(run_dir, ("A100:2",), replicas=1, env=env):
        info = ClusterInfo.load(run_dir)
        assert info.accounting_url == (database or default_url(run_dir))
        submitted = cli("submit", "-", "--wait", run_dir=run_dir, stdin=job(JOB, max_steps=30), env=env, timeout=300)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        view = json.loads(cli("status", JOB, "--json", run_dir=run_dir, env=env).stdout)

        def recorded() -> dict[str, Any] | None:
            answer = get_json(f"{info.monitor_url}/api/history?job={JOB}")
            done = [j for j in answer["jobs"] if j["state"] == "SUCCEEDED"]
            return done[0] if done else None

        record = wait_for("the monitor's /api/history to show the job SUCCEEDED", recorded, 30)
        assert (record["gpus"], record["gpu_model"], record["attempts"]) == (2, "A100", 1)
        assert record["final_loss"] == view["final_loss"] == view["shards"]["0"]["final_loss"]  # rank 0's
        assert record["wait_s"] >= 0 and record["run_s"] > 0
        assert record["gpu_hours"] == pytest.approx(2 * record["run_s"] / 3600)
        assert record["owner"] == getpass.getuser() and record["key_id"], record  # who, and the key that signed
        table = cli("history", "--job", JOB, run_dir=run_dir, env=env).stdout.splitlines()
        assert table[0].split()[2:5] == ["TEAM", "USER", "KEY"] and record["key_id"] in table[1].split(), table

    assert history(run_dir, env) == [record]  # no cluster, no broker: the database answers
    with local_cluster(run_dir, ("A100:1",), replicas=1, env=env):
        info = ClusterInfo.load(run_dir)
        assert history(run_dir, env) == [record]  # the new accounting service rebuilt from an empty log, and kept it
        assert get_json(f"{info.monitor_url}/api/history?job={JOB}")["jobs"] == [record]
