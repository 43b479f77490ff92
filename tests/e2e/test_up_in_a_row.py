"""``up`` never fails on a race of its own making (issue 33, item 11): started many times in a row, each time in a new
folder (the accounting replicas then create the run folder's SQLite file together: "database is locked" failed one
`up` in the first hour), through the CLI on a real broker, every start succeeds and every stop leaves nothing
running."""

import json
from pathlib import Path

import pytest

from shardyard.cli import claims
from tests.support.cluster import cli

pytestmark = [pytest.mark.slow, pytest.mark.broker]

STARTS = 5
LIGHT = ("--node", "A100:1", "--broker", "embedded")  # two replicas a service: two accounting writers


def test_up_and_down_many_times_in_a_row(tmp_path: Path) -> None:
    for start in range(STARTS):
        run_dir = tmp_path / f"run-{start}"
        started = cli("up", *LIGHT, run_dir=run_dir, timeout=180)
        assert started.returncode == 0, f"start {start + 1} of {STARTS}:\n{started.stdout}{started.stderr}"
        record = json.loads((run_dir / "cluster.json").read_text())
        logs = "".join(p.read_text(errors="replace") for p in (run_dir / "logs").glob("accounting-*.log"))
        assert "database is locked" not in logs, logs[-2000:]
        stopped = cli("down", run_dir=run_dir, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert not claims.running(record), f"start {start + 1}: processes left after down"
