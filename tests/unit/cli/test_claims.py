"""Local clusters never collide (``shardyard.cli.claims``): a run folder is in use only while a process of its
cluster runs, one ``up`` starts there at a time, and each cluster claims rendezvous ports no other running cluster on
the host holds. Real processes, locks and sockets; no broker."""

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardyard.cli import claims
from shardyard.cli.cluster_info import ClusterInfo
from shardyard.cli.rundir import DEMO_RUN_DIR, remember, start_dir_of
from shardyard.errors import ClusterError


@pytest.fixture(autouse=True)
def _own_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(claims.CLAIMS_DIR_ENV, str(tmp_path / "claims"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("SHARDYARD_RUN_DIR", raising=False)


def _info(run_dir: Path) -> ClusterInfo:
    run_dir.mkdir(parents=True, exist_ok=True)
    info = ClusterInfo(
        run_dir=str(run_dir.resolve()), bootstrap="", monitor_url="", data_root="/d", broker="kafka", started_at=0
    )
    info.starter_pid, info.started_at = os.getpid(), time.time()
    return info


FLOOR = {claims.RENDEZVOUS_BASE_ENV: "23000"}  # below the kernel's ephemeral ports: free unless a test listens


def test_a_folder_whose_processes_died_or_were_replaced_is_not_in_use(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    now = time.time()
    assert not claims.running({"pids": {"node-0": dead.pid}, "started": {"node-0": now}})
    # This process started before the record says its pid did: the pid was given to another process since.
    assert not claims.running({"pids": {"node-0": os.getpid()}, "started": {"node-0": now - 3600 * 24 * 365}})
    assert claims.running({"pids": {"node-0": os.getpid()}, "started": {"node-0": now}})
    assert claims.running({"starter_pid": os.getpid(), "started_at": now})


def test_one_up_at_a_time_per_folder_and_none_over_a_running_cluster(tmp_path: Path) -> None:
    with claims.starting(tmp_path / "run"):
        refused = pytest.raises(ClusterError, match=rf"another `shardyard up` \(pid {os.getpid()}\) is starting")
        with refused, claims.starting(tmp_path / "run"):
            pass
        _info(tmp_path / "run").save()  # its starter (this process) runs
    refused = pytest.raises(ClusterError, match=r"already running from .*shardyard down.*another --run-dir")
    with refused, claims.starting(tmp_path / "run"):
        pass


def test_clusters_side_by_side_claim_blocks_apart_and_a_stopped_one_frees_its_block(tmp_path: Path) -> None:
    first, second = _info(tmp_path / "a"), _info(tmp_path / "b")
    claims.claim_rendezvous(first, 3, FLOOR)
    claims.claim_rendezvous(second, 2, FLOOR)

    assert (first.rendezvous_base, first.rendezvous_ports) == (23000, 150)
    assert (second.rendezvous_base, second.rendezvous_ports) == (23150, 100)
    assert ClusterInfo.load(tmp_path / "a").rendezvous_base == 23000  # recorded in its cluster file

    claims.release(tmp_path / "a")
    third = _info(tmp_path / "c")
    claims.claim_rendezvous(third, 3, FLOOR)
    assert third.rendezvous_base == 23000


def test_a_claim_whose_cluster_no_longer_runs_is_free_again(tmp_path: Path) -> None:
    gone = _info(tmp_path / "a")
    claims.claim_rendezvous(gone, 1, FLOOR)
    gone.starter_pid = None  # nothing of it runs any more
    gone.save()
    again = _info(tmp_path / "b")
    claims.claim_rendezvous(again, 1, FLOOR)
    assert again.rendezvous_base == 23000


def test_a_block_something_listens_on_is_passed_over(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 23060))
        listener.listen()
        info = _info(tmp_path / "a")
        claims.claim_rendezvous(info, 2, FLOOR)
    assert info.rendezvous_base == 23100  # [23000, 23100) holds 23060


def test_a_new_cluster_never_starts_in_the_folder_the_user_default_names(tmp_path: Path) -> None:
    """The demo took over another cluster's folder through the user-level default (``up`` records it for the
    commands that read a cluster): starting one reads only --run-dir, SHARDYARD_RUN_DIR or its own default."""
    other = tmp_path / "other"
    _info(other).save()
    remember(other)
    args = argparse.Namespace(run_dir=None, sub_run_dir=None)
    assert start_dir_of(args, DEMO_RUN_DIR) == Path(DEMO_RUN_DIR)
    assert start_dir_of(argparse.Namespace(run_dir=str(other), sub_run_dir=None)) == other
