"""``shardyard up`` against its own embedded broker and real service processes: a process that dies at start-up
fails it at once, named, and the rest is stopped; a process that lost a race for its port is started again on a
fresh one, and the cluster file has the port it ended with."""

import os
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardyard.cli.cluster import CLUSTER_FILE, ClusterInfo, down, get_json, up
from shardyard.errors import ClusterError

pytestmark = [pytest.mark.slow, pytest.mark.broker]


def live_children() -> list[int]:
    """This process's children that still run (zombies aside)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


@pytest.fixture
def taken() -> Iterator[list[int]]:
    """Two ports held (bound) by this test: whoever is given one loses the race for it."""
    held = [socket.socket(), socket.socket()]
    for sock in held:
        sock.bind(("127.0.0.1", 0))
    yield [sock.getsockname()[1] for sock in held]
    for sock in held:
        sock.close()


def test_a_node_agent_that_dies_at_start_up_fails_up_at_once_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDYARD_STATUS_REFRESH_S", "-1")  # only agents read it: they refuse it and exit 2
    said: list[tuple[float, str]] = []
    began = time.monotonic()
    earlier = set(live_children())  # an earlier test's leftovers are not this `up`'s

    with pytest.raises(ClusterError) as failed:
        up(
            tmp_path / "run",
            nodes=("A100:1",),
            data_root=tmp_path / "data",
            timeout_s=90,
            say=lambda line: said.append((time.time(), line)),
        )

    message = str(failed.value)
    assert message.startswith("node-0 exited during start-up (exit code 2)"), message
    assert "status_refresh_s" in message  # the agent's own words, from its log
    noticed = next(at for at, line in said if line.startswith("start-up failed"))
    died = (tmp_path / "run" / "logs" / "node-0.log").stat().st_mtime  # its last words, as it exited
    print(f"\nup failed {noticed - died:.2f} s after node-0 died, {time.monotonic() - began:.1f} s after it began")
    assert noticed - died < 2.0
    assert time.monotonic() - began < 60  # against a 90 s timeout, stopping every service included
    assert not (tmp_path / "run" / CLUSTER_FILE).exists()
    left = {pid: Path(f"/proc/{pid}/stat").read_text()[:80] for pid in set(live_children()) - earlier}
    assert left == {}  # the broker and every service were stopped


def test_processes_that_lost_their_port_start_again_and_the_cluster_file_has_the_new_ports(
    tmp_path: Path, taken: list[int]
) -> None:
    first = {("monitor-0", "http"): taken[0], ("queue-1", "metrics"): taken[1]}
    said: list[str] = []

    def pick(name: str, role: str) -> int:
        if (name, role) in first:
            return first.pop((name, role))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    run_dir = tmp_path / "run"
    info = up(run_dir, nodes=("A100:1",), data_root=tmp_path / "data", timeout_s=180, say=said.append, pick_port=pick)
    try:
        assert sorted(line.split()[0] for line in said if "lost a race for a port" in line) == ["monitor-0", "queue-1"]
        saved = ClusterInfo.load(run_dir)
        assert saved.monitor_url == info.monitor_url == saved.monitor_urls[0]
        assert saved.monitor_url != f"http://127.0.0.1:{taken[0]}"
        assert saved.metrics_ports["queue-1"] not in taken
        assert get_json(f"{saved.monitor_url}/healthz")
        metrics_url = f"http://127.0.0.1:{saved.metrics_ports['queue-1']}/metrics"
        with urllib.request.urlopen(metrics_url, timeout=5) as scraped:
            assert scraped.status == 200
    finally:
        down(run_dir, say=lambda _m: None)
