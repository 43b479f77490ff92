"""``shardyard cancel`` and ``shardyard drain``: what they check, publish and print, against a small fake cluster
(the monitor's answers and the broker's topics as plain data). The real thing: tests/integration/test_cli_commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardyard.cli import client, main
from shardyard.cli.cluster import ClusterInfo
from shardyard.errors import ClusterError
from shardyard.events import Event, JobCancelRequested, NodeDrain


class FakeCluster:
    """The monitor's views (``jobs``, ``nodes``) and what was published; a wait sees ``after_wait``."""

    def __init__(self, jobs: dict[str, str], nodes: tuple[str, ...] = ()) -> None:
        self.jobs = {job_id: {"job_id": job_id, "state": state, "message": ""} for job_id, state in jobs.items()}
        self.nodes = {node_id: {"node_id": node_id, "draining": False} for node_id in nodes}
        self.published: list[Event] = []
        self.after_wait: dict[str, Any] | None = None

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(client, "job", lambda _url, job_id: self.jobs.get(job_id))
        monkeypatch.setattr(client, "node", lambda _url, node_id: self.nodes.get(node_id))
        monkeypatch.setattr(client, "publish", lambda _bootstrap, event: self.published.append(event))
        monkeypatch.setattr(client, "wait", self.wait)
        monkeypatch.setattr(client, "wait_node", self.wait_node)

    def wait(self, _url: str, job_id: str, **_options: Any) -> dict[str, Any]:
        if self.after_wait is None:
            raise ClusterError(f"job {job_id} did not finish within 1s (last state: READY)")
        return self.after_wait

    def wait_node(self, _url: str, node_id: str, *, draining: bool, **_options: Any) -> dict[str, Any]:
        return {"node_id": node_id, "draining": draining}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    ClusterInfo(
        run_dir=str(tmp_path),
        bootstrap="127.0.0.1:1",
        monitor_url="http://127.0.0.1:1",
        data_root=str(tmp_path / "data"),
        embedded_broker=False,
        started_at=0.0,
    ).save()
    return tmp_path


def run(run_dir: Path, *argv: str) -> int:
    return main.main(["--run-dir", str(run_dir), *argv])


@pytest.mark.parametrize(
    ("state", "code", "published"),
    [
        pytest.param("ACCEPTED", 0, True, id="accepted"),
        pytest.param("WAITING", 0, True, id="waiting"),
        pytest.param("READY", 0, True, id="ready"),
        pytest.param("RUNNING", 0, True, id="running"),
        pytest.param("SUCCEEDED", 1, False, id="succeeded"),
        pytest.param("FAILED", 1, False, id="failed"),
        pytest.param("CANCELLED", 1, False, id="cancelled"),
        pytest.param("REJECTED", 1, False, id="rejected"),
    ],
)
def test_cancel_asks_only_for_an_unfinished_job(
    state: str, code: int, published: bool, run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    cluster = FakeCluster({"j1": state})
    cluster.install(monkeypatch)

    assert run(run_dir, "cancel", "j1") == code

    out, err = capsys.readouterr()
    if published:
        (request,) = cluster.published
        assert isinstance(request, JobCancelRequested) and request.job_id == "j1"
        assert request.requested_by.startswith("cli")
        assert f"cancel requested for j1 (state {state})" in out
    else:
        assert cluster.published == []
        assert f"already ended {state}" in err


def test_cancel_of_an_unknown_job_says_so(run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    cluster = FakeCluster({})
    cluster.install(monkeypatch)

    assert run(run_dir, "cancel", "ghost") == 1

    assert cluster.published == []
    assert "no job 'ghost'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("final", "code", "says"),
    [
        pytest.param("CANCELLED", 0, "job j1 cancelled: cancelled by cli", id="cancelled"),
        pytest.param("SUCCEEDED", 1, "ended SUCCEEDED before the cancellation took effect", id="finished-first"),
    ],
)
def test_cancel_wait(
    final: str, code: int, says: str, run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    cluster = FakeCluster({"j1": "RUNNING"})
    cluster.after_wait = {"job_id": "j1", "state": final, "message": "cancelled by cli"}
    cluster.install(monkeypatch)

    assert run(run_dir, "cancel", "j1", "--wait", "--timeout", "1") == code

    out, err = capsys.readouterr()
    assert says in out + err


def test_cancel_wait_past_its_deadline_is_an_error(run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    FakeCluster({"j1": "RUNNING"}).install(monkeypatch)

    assert run(run_dir, "cancel", "j1", "--wait", "--timeout", "1") == 2

    assert "did not finish within 1s" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "draining", "says"),
    [
        pytest.param(("drain", "n1"), True, "draining n1", id="drain"),
        pytest.param(("drain", "n1", "--undo"), False, "undraining n1", id="undo"),
        pytest.param(("drain", "n1", "--wait"), True, "node n1 is draining", id="drain-wait"),
        pytest.param(("drain", "n1", "--undo", "--wait"), False, "node n1 is no longer draining", id="undo-wait"),
    ],
)
def test_drain(
    argv: tuple[str, ...],
    draining: bool,
    says: str,
    run_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:
    cluster = FakeCluster({}, nodes=("n1",))
    cluster.install(monkeypatch)

    assert run(run_dir, *argv) == 0

    (request,) = cluster.published
    assert isinstance(request, NodeDrain) and (request.node_id, request.draining) == ("n1", draining)
    assert says in capsys.readouterr().out


def test_drain_of_an_unknown_node_says_so(run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    cluster = FakeCluster({}, nodes=("n1",))
    cluster.install(monkeypatch)

    assert run(run_dir, "drain", "n9") == 1

    assert cluster.published == []
    assert "no node 'n9'" in capsys.readouterr().err
