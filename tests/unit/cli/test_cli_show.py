"""``shardyard status``, ``jobs``, ``nodes`` and ``alerts`` against a fake monitor (its answers as plain data):
``-o json`` prints the monitor's answer as it is, ``status`` is the cluster summary and ``jobs`` the job listing;
``submit`` fills in the owner; and a listing loads none of the heavy libraries, against a real HTTP monitor."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from shardyard.cli import client, main
from shardyard.cli.cluster import ClusterInfo
from tests.unit.cli.test_cli_listing import FIRING, SUMMARY, job, link, node

ANSWERS: dict[str, Any] = {
    "jobs": {"jobs": [job()], "counts": {"RUNNING": 1}},
    "nodes": {"nodes": [node()]},
    "alerts": {"firing": [FIRING], "recent": [FIRING]},
    "summary": SUMMARY,
    "links": {"nodes": ["n1", "n2"], "links": [link("n1", "n2", 0.5)]},
}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    ClusterInfo(str(tmp_path), "127.0.0.1:1", "http://127.0.0.1:1", str(tmp_path), False, 0.0).save()
    return tmp_path


@pytest.fixture
def monitor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "listing", lambda _url, what: ANSWERS[what])
    monkeypatch.setattr(client, "links", lambda _url: ANSWERS["links"])
    monkeypatch.setattr(client, "job", lambda _url, job_id: job(job_id=job_id, timeline=[]) if job_id == "j1" else None)


def run(run_dir: Path, *argv: str) -> int:
    return main.main(["--run-dir", str(run_dir), *argv])


@pytest.mark.parametrize(
    ("argv", "answer"),
    [
        pytest.param(("jobs", "-o", "json"), ANSWERS["jobs"], id="jobs"),
        pytest.param(("nodes", "-o", "json"), ANSWERS["nodes"], id="nodes"),
        pytest.param(("nodes", "--links", "-o", "json"), ANSWERS["links"], id="links"),
        pytest.param(("alerts", "-o", "json"), ANSWERS["alerts"], id="alerts"),
        pytest.param(("alerts", "--json"), ANSWERS["alerts"], id="alerts-older-flag"),
        pytest.param(("status", "-o", "json"), SUMMARY, id="status"),
        pytest.param(("status", "j1", "--json"), job(timeline=[]), id="status-job"),
        pytest.param(("status", "j1", "-o", "json"), job(timeline=[]), id="status-job-o-json"),
    ],
)
def test_json_is_the_monitors_answer_as_it_is(
    argv: tuple[str, ...], answer: Any, run_dir: Path, monitor: None, capsys: Any
) -> None:
    assert run(run_dir, *argv) == 0

    out = capsys.readouterr().out
    assert json.loads(out) == answer and out == json.dumps(answer, indent=2) + "\n"


def test_status_is_the_cluster_summary_and_jobs_the_listing(run_dir: Path, monitor: None, capsys: Any) -> None:
    assert run(run_dir, "status") == 0
    summary = capsys.readouterr().out
    assert run(run_dir, "jobs") == 0
    jobs = capsys.readouterr().out

    assert summary != jobs
    assert summary.startswith("monitor: http://127.0.0.1:1\nscheduler leader: scheduler-1")
    assert "  A100   4     2       1     1" in summary and "j1" not in summary
    assert jobs.splitlines()[0].split()[:4] == ["JOB", "STATE", "OWNER", "QUEUE"]
    assert jobs.splitlines()[1].split()[:4] == ["j1", "RUNNING", "alice", "default"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        pytest.param(("jobs", "-o", "wide"), "SUBMITTED", id="jobs"),
        pytest.param(("nodes", "-o", "wide"), "DISK FREE", id="nodes"),
        pytest.param(("nodes", "--links", "-o", "wide"), "the 1 measured links among 2 live nodes", id="links"),
        pytest.param(("alerts", "-o", "wide"), "THRESHOLD", id="alerts"),
        pytest.param(("status", "-o", "wide"), "GPU utilisation: 42%", id="status"),
        pytest.param(("status", "j1", "-o", "wide"), "loss:", id="status-job"),
    ],
)
def test_wide(argv: tuple[str, ...], says: str, run_dir: Path, monitor: None, capsys: Any) -> None:
    assert run(run_dir, *argv) == 0

    assert says in capsys.readouterr().out


def test_status_of_an_unknown_job_says_so(run_dir: Path, monitor: None, capsys: Any) -> None:
    assert run(run_dir, "status", "ghost") == 1

    assert "no job 'ghost'" in capsys.readouterr().err


def test_a_listing_without_a_cluster_says_so(tmp_path: Path, capsys: Any) -> None:
    assert run(tmp_path, "jobs") == 2

    assert "no cluster is running from" in capsys.readouterr().err


# --- submit fills in the owner ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("document", "owner"),
    [
        pytest.param({"task_id": "a"}, "alice", id="none-named"),
        pytest.param({"task_id": "a", "owner": None}, "alice", id="null"),
        pytest.param({"task_id": "a", "owner": "bob"}, "bob", id="given-kept"),
    ],
)
def test_with_owner(document: dict[str, Any], owner: str) -> None:
    assert json.loads(client.with_owner(json.dumps(document).encode(), "alice")) == {**document, "owner": owner}


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"{this is not json", id="not-json"),
        pytest.param(b'["an", "array"]', id="not-an-object"),
        pytest.param(b'{"task_id": "a", "owner": "bob"}', id="named-bytes-untouched"),
    ],
)
def test_with_owner_leaves_other_bytes_as_they_are(raw: bytes) -> None:
    assert client.with_owner(raw, "alice") == raw
    assert client.with_owner(b'{"task_id": "a"}', None) == b'{"task_id": "a"}'


def test_submit_names_the_local_user_as_owner(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    produced: list[bytes] = []
    monkeypatch.setattr(main.getpass, "getuser", lambda: "alice")
    monkeypatch.setattr(
        client, "submit", lambda _bootstrap, raw, _signed=(): produced.append(raw) or client.Submitted("j", 0, 1)
    )
    example = json.loads(main.EXAMPLE.read_text())
    given = tmp_path / "given.json"
    given.write_text(json.dumps({**example, "owner": "bob"}))

    assert run(run_dir, "submit", str(main.EXAMPLE), "--no-verdict") == 0  # no cluster here to answer
    assert run(run_dir, "submit", str(given), "--no-verdict") == 0

    assert [json.loads(raw)["owner"] for raw in produced] == ["alice", "bob"]
    assert json.loads(produced[0]) == {**example, "owner": "alice"}


# --- a listing stays light ----------------------------------------------------------------------------------------
class Monitor(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        what = self.path.removeprefix("/api/")
        body = json.dumps(ANSWERS.get(what, {"ok": True})).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Path]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Monitor)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    ClusterInfo(str(tmp_path), "127.0.0.1:1", url, str(tmp_path), False, 0.0, monitor_urls=[url]).save()
    yield tmp_path
    server.shutdown()
    server.server_close()


HEAVY = ("pydantic", "pydantic_core", "aiokafka", "torch", "opentelemetry", "asyncio", "faststream", "numpy")


@pytest.mark.parametrize(
    "argv", [("jobs", "-o", "wide"), ("nodes",), ("alerts",), ("status",)], ids=["jobs", "nodes", "alerts", "status"]
)
def test_a_listing_loads_none_of_the_heavy_libraries(argv: tuple[str, ...], served: Path) -> None:
    """What makes a call answer in well under 300 ms: the event models, Kafka's client, the tracing and asyncio are
    for the commands that publish; a listing reads the monitor over plain HTTP and renders its JSON."""
    probe = (
        "import sys, shardyard.cli.main as m\n"
        f"code = m.main(['--run-dir', {str(served)!r}, *{list(argv)!r}])\n"
        f"print(code, sorted({{n.split('.')[0] for n in sys.modules}} & {set(HEAVY)!r}), file=sys.stderr)\n"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert ran.stderr.strip().splitlines()[-1] == "0 []", ran.stdout + ran.stderr
    assert ran.stdout.strip()
