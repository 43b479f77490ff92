"""The local provider's bookkeeping on real processes (a stand-in ``sleep`` for an agent): what it manages, where
``down`` finds it (the cluster file), and how it stops one: SIGTERM, then SIGKILL after its bounded wait."""

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shardyard.autoscale.local import STATE_FILE, LocalProvider, node_id_of
from shardyard.autoscale.provider import ProviderError
from shardyard.cli.children import CLUSTER_FILE


def stand_in(run_dir: Path, node_id: str, argv: list[str], slot: int = 0) -> subprocess.Popen[bytes]:
    """A process recorded as the agent of ``node_id``, as ``add`` records one."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE)
    state = json.loads((run_dir / STATE_FILE).read_text()) if (run_dir / STATE_FILE).exists() else {}
    state[node_id] = {
        "pid": process.pid,
        "started": time.time(),
        "slot": slot,
        "gpu_model": "V100",
        "gpus": 2,
        "metrics_port": 9999,
    }
    (run_dir / STATE_FILE).write_text(json.dumps(state))
    return process


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    (tmp_path / CLUSTER_FILE).write_text(json.dumps({"pids": {"node-0": 1}, "started": {}, "metrics_ports": {}}))
    return tmp_path


def cluster_pids(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / CLUSTER_FILE).read_text())["pids"])


def test_its_running_agents_are_what_it_manages_and_are_recorded_where_down_finds_them(run_dir: Path) -> None:
    provider = LocalProvider(run_dir, 30000, 2)
    agent = stand_in(run_dir, "auto-v100-0", ["sleep", "30"])
    try:
        assert [(n.node_id, n.gpu_model, n.gpus) for n in provider.nodes()] == [("auto-v100-0", "V100", 2)]
        assert cluster_pids(run_dir) == {"node-0": 1, "node-auto-v100-0": agent.pid}
        agent.kill()
        agent.wait()
        assert provider.nodes() == []  # it died: no longer managed, and out of the cluster file
        assert cluster_pids(run_dir) == {"node-0": 1}
    finally:
        agent.kill()


def test_remove_stops_the_agent_with_sigterm_then_sigkill_after_its_timeout(run_dir: Path) -> None:
    provider = LocalProvider(run_dir, 30000, 2, stop_timeout_s=0.5)
    ignore = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(30)"
    )
    polite = stand_in(run_dir, "auto-v100-0", ["sleep", "30"])
    deaf = stand_in(run_dir, "auto-v100-1", [sys.executable, "-c", ignore], slot=1)
    assert deaf.stdout is not None and deaf.stdout.readline() == b"ready\n"  # it ignores SIGTERM from here on
    try:
        provider.remove("auto-v100-0")
        assert polite.wait(timeout=5) == -15
        began = time.monotonic()
        provider.remove("auto-v100-1")
        assert deaf.wait(timeout=5) == -9
        assert time.monotonic() - began < 5
        assert provider.nodes() == [] and cluster_pids(run_dir) == {"node-0": 1}
        provider.remove("auto-v100-9")  # not managed: nothing to do
    finally:
        polite.kill()
        deaf.kill()


def test_close_stops_every_agent(run_dir: Path) -> None:
    provider = LocalProvider(run_dir, 30000, 2)
    agents = [stand_in(run_dir, f"auto-v100-{k}", ["sleep", "30"], slot=k) for k in range(2)]
    try:
        provider.close()
        assert [agent.wait(timeout=5) for agent in agents] == [-15, -15]
        assert provider.nodes() == []
    finally:
        for agent in agents:
            agent.kill()


def test_adding_without_a_cluster_is_a_provider_error(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    with pytest.raises(ProviderError, match="no cluster"):
        LocalProvider(tmp_path_factory.mktemp("none"), 30000, 1).add("V100", 2, 1)
    assert node_id_of("V100", 3) == "auto-v100-3"
