"""Two local clusters on one host never collide (issue 33, item 1), through the CLI on real brokers and services:
a second ``up`` started without naming a folder starts in its own, not in the one the user-level default names;
the two claim rendezvous ports apart, and a gang runs in each at once on its first attempt; two ``up``s racing for
one folder leave exactly one cluster there, whose file names it."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shardyard.bus.transport import TRANSPORT_ENVS
from shardyard.cli import claims
from shardyard.cli.cluster import CLUSTER_FILE, ClusterInfo
from shardyard.training.artifacts import create_demo_artifacts
from tests.support import wait
from tests.support.cluster import cli, job, reachable_by_shards

pytestmark = [pytest.mark.slow, pytest.mark.broker]

SMALL = ("--replicas", "1", "--node", "A100:2", "--broker", "embedded")
"""One process per service, one node of two GPUs, the embedded broker: the lightest cluster a gang runs on."""


def shardyard(
    *args: str, cwd: Path, stdin: bytes | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``shardyard ARGS...`` run from ``cwd``, naming no run folder (as a user types it)."""
    env = {k: v for k, v in os.environ.items() if k not in TRANSPORT_ENVS and k != "SHARDYARD_RUN_DIR"}
    return subprocess.run(
        [sys.executable, "-m", "shardyard.cli.main", *args],
        cwd=cwd,
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env, "PYTHONUNBUFFERED": "1"},
    )


def record(run_dir: Path) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((run_dir / CLUSTER_FILE).read_text())
    return loaded


def ports(info: ClusterInfo) -> set[int]:
    """Every port the cluster file records: the broker's, each process's metrics, the monitors' APIs, and the
    rendezvous block."""
    apis = {int(url.rsplit(":", 1)[1]) for url in info.monitor_urls}
    block = set(range(info.rendezvous_base, info.rendezvous_base + info.rendezvous_ports))
    return {*info.broker_ports.values(), *info.metrics_ports.values(), *apis, *block}


def ended(run_dir: Path, job_id: str) -> dict[str, object]:
    def view() -> dict[str, object] | None:
        shown = cli("status", job_id, "--json", run_dir=run_dir)
        found: dict[str, object] = json.loads(shown.stdout) if shown.returncode == 0 else {}
        return found if found.get("state") in ("SUCCEEDED", "FAILED", "REJECTED") else None

    return wait.until(view, f"{job_id} to end", 240, every_s=0.5)


def test_a_second_cluster_starts_in_its_own_folder_with_its_own_rendezvous_ports(tmp_path: Path) -> None:
    first, here = tmp_path / "first", tmp_path / "elsewhere"
    here.mkdir()
    reachable_by_shards(here)
    create_demo_artifacts(first / "data")
    create_demo_artifacts(here / ".shardyard" / "data")
    started = cli("up", *SMALL, run_dir=first)  # records `first` as the user-level default
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        second = shardyard("up", *SMALL, cwd=here)
        assert second.returncode == 0, second.stdout + second.stderr
        try:
            assert claims.running(record(first)), "the first cluster was disturbed"
            a, b = ClusterInfo.load(first), ClusterInfo.load(here / ".shardyard")
            blocks = sorted((i.rendezvous_base, i.rendezvous_base + i.rendezvous_ports) for i in (a, b))
            assert blocks[0][1] <= blocks[1][0], f"rendezvous ports overlap: {blocks}"
            assert f"rendezvous ports {b.rendezvous_base}-" in second.stdout
            used = [ports(info) for info in (a, b)]
            assert used[0] and used[1] and not used[0] & used[1], used  # every port recorded, none shared

            # A gang in each at once: neither loses an attempt to the other's ports.
            with ThreadPoolExecutor(2) as pool:
                sent = [
                    pool.submit(cli, "submit", "-", run_dir=first, stdin=job("apart-a", max_steps=20)),
                    pool.submit(shardyard, "submit", "-", cwd=here, stdin=job("apart-b", max_steps=20)),
                ]
            for done in sent:
                assert done.result().returncode == 0, done.result().stdout + done.result().stderr
            for run_dir, job_id in ((first, "apart-a"), (here / ".shardyard", "apart-b")):
                view = ended(run_dir, job_id)
                assert (view["state"], view.get("attempt")) == ("SUCCEEDED", 1), view
        finally:
            stopped = shardyard("down", cwd=here)  # ./.shardyard runs a cluster: `down` here means it
            assert stopped.returncode == 0, stopped.stderr
        assert claims.running(record(first)), "stopping the second stopped the first"
    finally:
        cli("down", run_dir=first, timeout=120)


def test_two_ups_racing_for_one_folder_leave_one_cluster_whose_file_names_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    create_demo_artifacts(run_dir / "data")
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: cli("up", *SMALL, run_dir=run_dir), range(2)))
    try:
        codes = sorted(done.returncode for done in both)
        assert codes == [0, 2], [done.stdout + done.stderr for done in both]
        loser = next(done for done in both if done.returncode == 2)
        assert "another `shardyard up`" in loser.stderr or "already running" in loser.stderr, loser.stderr
        assert claims.running(record(run_dir))
        shown = cli("status", run_dir=run_dir)
        assert shown.returncode == 0, shown.stderr
    finally:
        cli("down", run_dir=run_dir, timeout=120)
