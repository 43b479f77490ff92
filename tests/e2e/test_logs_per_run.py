"""``shardyard logs`` keeps cluster runs apart: two clusters started one after the other from the same folder, the
second ``--fresh`` (its broker's log emptied), run a job of the same id (a job id is unique within a broker's log
only), and the logs shown are the running cluster's, then,
once it is down, the newest run's; never the two mixed into one attempt."""

import re
from pathlib import Path

import pytest

from shardyard.cli.cluster import ClusterInfo
from tests.support.cluster import cli, job, local_cluster

pytestmark = [pytest.mark.slow, pytest.mark.broker]

JOB = "same-id"
PROGRESS = re.compile(
    r"^\[shard (\d) attempt 1\] shardyard\.training\[rank \1/2\]: step (\d+)/(\d+) loss \S+ syncs \d+ at \S+Z$"
)


def run_once(run_dir: Path, max_steps: int, *options: str) -> str:
    """A cluster from ``run_dir`` (``up`` given ``options``) runs the job to its end; its run id."""
    with local_cluster(run_dir, replicas=1, options=options):
        done = cli("submit", "-", "--wait", run_dir=run_dir, stdin=job(JOB, max_steps=max_steps))
        assert done.returncode == 0, done.stdout + done.stderr
        shown = cli("logs", JOB, run_dir=run_dir)
        assert shown.returncode == 0, shown.stderr
        assert_one_run(shown.stdout, max_steps)
        return ClusterInfo.load(run_dir).run_id


def assert_one_run(out: str, max_steps: int) -> None:
    progress = [PROGRESS.match(line) for line in out.splitlines()]
    assert {(m.group(1), m.group(3)) for m in progress if m} == {("0", str(max_steps)), ("1", str(max_steps))}, out
    assert all(line.startswith(("[shard 0 attempt 1] ", "[shard 1 attempt 1] ")) for line in out.splitlines()), out


def test_two_runs_of_one_job_id_in_one_folder_keep_their_logs_apart(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = run_once(run_dir, 20)
    second = run_once(run_dir, 30, "--fresh")

    assert first != second
    assert sorted(p.name for p in (run_dir / "logs" / "shards").iterdir() if (p / JOB).is_dir()) == [first, second]
    after = cli("logs", JOB, "--shard", "1", "--attempt", "1", run_dir=run_dir)  # no cluster now: the newest run
    assert after.returncode == 0, after.stderr
    assert "step 30/30" in after.stdout and "/20 " not in after.stdout, after.stdout
    earlier = cli("logs", JOB, "--log-dir", str(run_dir / "logs" / "shards" / first), run_dir=run_dir)
    assert_one_run(earlier.stdout, 20)
