"""Follow views say what happens (issue 33, item 5), through the CLI on a real cluster: a job whose first attempt
fails is followed by ``submit --wait`` with the failure's cause and the retries used and left; ``logs`` of a shard
that has written nothing says so; ELAPSED counts from the submission across attempts."""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from shardyard.training.artifacts import create_demo_artifacts
from tests.support import wait
from tests.support.cluster import ONE_REPLICA, ROOT, TRANSPORT_ENVS, cli

pytestmark = [pytest.mark.slow, pytest.mark.broker]

QUIET_FIRST_TRY = "import os, sys, time; time.sleep(6); sys.exit(1 if os.environ['SHARDYARD_ATTEMPT'] == '1' else 0)"
"""A script that writes nothing, and fails its first attempt with a status retried (a process exit)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    run_dir = tmp_path_factory.mktemp("follow")
    create_demo_artifacts(run_dir / "data")
    started = cli("up", *ONE_REPLICA, "--node", "A100:1", run_dir=run_dir, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield run_dir
    finally:
        cli("down", run_dir=run_dir, timeout=120)


def script_job(task_id: str) -> bytes:
    document: dict[str, Any] = json.loads((ROOT / "examples" / "ddp_job.json").read_text())
    document.update(task_id=task_id, shard_count=1)
    document["resource_requirements"] = {"gpu": {"count": 1, "model": "A100"}, "memory": "1GiB", "cpu_cores": 1}
    document["entrypoint"] = {"command": [sys.executable, "-c", QUIET_FIRST_TRY]}
    return json.dumps(document).encode()


def test_a_retried_job_is_followed_with_its_failure_its_retries_and_its_whole_time(cluster: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in TRANSPORT_ENVS}
    document = cluster / "follow-retry.json"
    document.write_bytes(script_job("follow-retry"))
    follower = subprocess.Popen(
        [sys.executable, "-m", "shardyard.cli.main", "--run-dir", str(cluster), "submit", str(document), "--wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONUNBUFFERED": "1"},
    )

    def silent_log() -> str | None:  # the first attempt runs and has written nothing
        shown = cli("logs", "follow-retry", run_dir=cluster)
        return shown.stderr if shown.returncode == 0 and "no output yet" in shown.stderr else None

    said = wait.until(silent_log, "logs to say the shard has no output yet", 120, every_s=0.5)
    assert "attempt 1" in said and shown_nothing(cluster)
    out, err = follower.communicate(timeout=240)

    assert follower.returncode == 0, out + err
    assert "recovering: attempt 1 failed (PROCESS_EXIT" in out, out
    assert "retry 1, 2 left" in out or "retry 1, " in out, out
    assert "since submission" in out, out
    view = json.loads(cli("status", "follow-retry", "--json", run_dir=cluster).stdout)
    assert (view["state"], view["attempt"]) == ("SUCCEEDED", 2), view
    row = next(line.split() for line in cli("jobs", run_dir=cluster).stdout.splitlines() if "follow-retry" in line)
    whole = datetime.fromisoformat(view["ended_at"]) - datetime.fromisoformat(view["submitted_at"])
    shown = seconds(row[-1])  # ELAPSED: both attempts and the wait between them
    assert abs(shown - whole.total_seconds()) <= 1.0, (row, view)
    assert whole.total_seconds() >= 12  # two attempts of 6 s: the last attempt's alone would be half that


def seconds(text: str) -> float:
    """``12s`` or ``1m05s`` in seconds."""
    minutes, _, rest = text.rpartition("m")
    return 60 * int(minutes or 0) + int(rest.rstrip("s"))


def shown_nothing(run_dir: Path) -> bool:
    return cli("logs", "follow-retry", run_dir=run_dir).stdout == ""
