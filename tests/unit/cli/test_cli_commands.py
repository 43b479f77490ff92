"""``shardyard cancel`` and ``shardyard drain``: what they check, publish and print, against a small fake cluster
(the monitor's answers and the broker's topics as plain data). The real thing: tests/integration/test_cli_commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shardyard.cli import client, main
from shardyard.cli.cluster import ClusterInfo
from shardyard.cli.rundir import SHARD_LOGS, shard_log_dir
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
        broker="external",
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


# --- alerts, top, logs -------------------------------------------------------------------------------------------
FIRING = {
    "type": "alert.firing",
    "occurred_at": "2026-01-01T00:00:05+00:00",
    "rule": "NODE_SUSPECT",
    "subject": "node-1",
    "severity": "WARNING",
    "summary": "node-1 is SUSPECT: no heartbeat for 3.5 s",
    "value": 3.5,
    "threshold": 0.0,
    "since": "2026-01-01T00:00:01+00:00",
}
ANSWERS: dict[str, dict[str, Any]] = {
    "alerts": {"firing": [FIRING], "recent": [FIRING]},
    "nodes": {
        "nodes": [
            {
                "node_id": "node-1",
                "status": "SUSPECT",
                "gpus": [{"model": "A100", "tflops": 35.0, "utilization": 0.5, "temperature_c": 71.0}],
                "allocated_gpus": [0],
                "cpu_load": 0.2,
            }
        ]
    },
    "jobs": {
        "jobs": [
            {"job_id": "j1", "state": "RUNNING", "step": 40, "max_steps": 300, "loss": 3.25, "reason": None}
            | {"message": "", "submitted_at": None}
        ]
    },
}


@pytest.fixture
def monitor(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """The monitor's /api/<what> answers, as plain data."""
    answers = {what: dict(answer) for what, answer in ANSWERS.items()}
    monkeypatch.setattr(client, "listing", lambda _url, what: answers[what])
    return answers


def test_alerts_prints_firing_and_history(run_dir: Path, monitor: dict[str, Any], capsys: Any) -> None:
    assert run(run_dir, "alerts") == 0

    out = capsys.readouterr().out.splitlines()
    assert out[0] == "firing (1):"
    assert out[2].split()[:3] == ["WARNING", "NODE_SUSPECT", "node-1"]
    assert out[6].split()[:4] == ["00:00:05", "FIRING", "NODE_SUSPECT", "node-1"]


def test_alerts_json_is_the_monitors_answer(run_dir: Path, monitor: dict[str, Any], capsys: Any) -> None:
    assert run(run_dir, "alerts", "--json") == 0

    assert json.loads(capsys.readouterr().out) == ANSWERS["alerts"]


def test_top_once_prints_one_frame(run_dir: Path, monitor: dict[str, Any], capsys: Any) -> None:
    assert run(run_dir, "top", "--once") == 0

    frame = capsys.readouterr().out
    assert "nodes 0/1 alive  jobs 1 running / 1  alerts 1 firing" in frame
    assert "node-1  SUSPECT  1xA100 35TF  1/1     50%       20%   71C" in frame
    assert "j1   RUNNING  40/300  3.25" in frame
    assert "NODE_SUSPECT  node-1" in frame


def test_top_redraws_until_interrupted_and_outlives_a_lost_monitor(
    run_dir: Path, monitor: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    frames = iter(["monitor dies", "still gone", "user stops"])

    def unreachable(_url: str, _what: str) -> dict[str, Any]:
        raise ClusterError("no monitor")

    def between_frames(_seconds: float) -> None:
        step = next(frames)
        if step == "monitor dies":
            monkeypatch.setattr(client, "listing", unreachable)
        elif step == "user stops":
            raise KeyboardInterrupt

    monkeypatch.setattr(main.time, "sleep", between_frames)

    assert run(run_dir, "top") == 130

    out = capsys.readouterr().out
    assert out.count("shardyard top  ") == 1 and "shardyard top: no monitor" in out


def write_logs(run_dir: Path, job_id: str = "j1") -> Path:
    """The agents' logs of the cluster run from ``run_dir`` (``RUN_DIR/logs/shards/RUN/JOB``)."""
    folder = shard_log_dir(run_dir, job_id) / job_id
    folder.mkdir(parents=True)
    (folder / "shard-0-attempt-1.log").write_text("s0 a1 first\ns0 a1 died\n")
    (folder / "shard-0-attempt-2.log").write_text("s0 a2 resumed\n")
    (folder / "shard-1-attempt-1.log").write_text("s1 a1 only\nno newline yet")
    (folder / "notes.txt").write_text("not a shard log\n")
    return folder


@pytest.mark.parametrize(
    ("argv", "lines"),
    [
        pytest.param(
            (),
            [
                "[shard 0 attempt 2] s0 a2 resumed",
                "[shard 1 attempt 1] s1 a1 only",
                "[shard 1 attempt 1] no newline yet",
            ],
            id="every-shard-newest-attempt",
        ),
        pytest.param(("--shard", "0"), ["s0 a2 resumed"], id="one-shard"),
        pytest.param(("--shard", "0", "--attempt", "1"), ["s0 a1 first", "s0 a1 died"], id="older-attempt"),
        pytest.param(
            ("--attempt", "1"),
            [
                "[shard 0 attempt 1] s0 a1 first",
                "[shard 0 attempt 1] s0 a1 died",
                "[shard 1 attempt 1] s1 a1 only",
                "[shard 1 attempt 1] no newline yet",
            ],
            id="one-attempt-every-shard",
        ),
    ],
)
def test_logs(argv: tuple[str, ...], lines: list[str], run_dir: Path, capsys: Any) -> None:
    write_logs(run_dir)

    assert run(run_dir, "logs", "j1", *argv) == 0

    assert capsys.readouterr().out.splitlines() == lines


def earlier_run(run_dir: Path, run_id: str, job_id: str = "j1") -> Path:
    """Logs of ``job_id`` that a cluster run before this one left in the same folder."""
    folder = run_dir / SHARD_LOGS / run_id / job_id
    folder.mkdir(parents=True)
    (folder / "shard-0-attempt-1.log").write_text("earlier a1\n")
    (folder / "shard-0-attempt-2.log").write_text("earlier a2\n")
    return folder


def test_logs_are_this_cluster_runs_only(run_dir: Path, capsys: Any) -> None:
    earlier_run(run_dir, "20200101T000000Z-000000")
    write_logs(run_dir)

    assert run(run_dir, "logs", "j1", "--shard", "0") == 0
    assert capsys.readouterr().out.splitlines() == ["s0 a2 resumed"]
    assert run(run_dir, "logs", "j1", "--shard", "0", "--attempt", "1") == 0
    assert capsys.readouterr().out.splitlines() == ["s0 a1 first", "s0 a1 died"]


def test_a_job_this_run_has_not_started_shows_no_earlier_runs_logs(run_dir: Path, capsys: Any) -> None:
    earlier_run(run_dir, "20200101T000000Z-000000")

    assert run(run_dir, "logs", "j1") == 1
    assert f"no logs of job j1 under {shard_log_dir(run_dir, 'j1')}" in capsys.readouterr().err


def test_with_no_cluster_running_the_newest_run_of_the_job_is_shown(tmp_path: Path, capsys: Any) -> None:
    earlier_run(tmp_path, "20200101T000000Z-000000")
    (earlier_run(tmp_path, "20210101T000000Z-abcdef") / "shard-0-attempt-2.log").write_text("newer a2\n")
    earlier_run(tmp_path, "20220101T000000Z-abcdef", job_id="other")

    assert run(tmp_path, "logs", "j1") == 0
    assert capsys.readouterr().out.splitlines() == ["[shard 0 attempt 2] newer a2"]


def test_logs_from_another_folder(tmp_path: Path, run_dir: Path, capsys: Any) -> None:
    elsewhere = write_logs(tmp_path / "agent").parent

    assert run(run_dir, "logs", "j1", "--shard", "1", "--log-dir", str(elsewhere)) == 0

    assert capsys.readouterr().out.splitlines() == ["s1 a1 only", "no newline yet"]


@pytest.mark.parametrize(
    ("job", "says"),
    [
        pytest.param("ghost", "no logs of job ghost under", id="unknown-job"),
        pytest.param("../etc", "'../etc' is not a job id", id="not-a-job-id"),
    ],
)
def test_logs_refuses(job: str, says: str, run_dir: Path, capsys: Any) -> None:
    write_logs(run_dir)

    assert run(run_dir, "logs", job) == 1

    assert says in capsys.readouterr().err


def test_logs_follow_prints_new_lines_until_the_job_ends(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    folder = write_logs(run_dir)
    states = iter(["RUNNING", "SUCCEEDED"])
    monkeypatch.setattr(client, "job", lambda _url, job_id: {"job_id": job_id, "state": next(states)})

    writes = iter([" now ended\nlast words", None])

    def between_reads(_seconds: float) -> None:  # instead of waiting: the shard writes, then a new attempt starts
        more = next(writes)
        if more is not None:
            with (folder / "shard-1-attempt-1.log").open("a") as log:
                log.write(more)
            (folder / "shard-1-attempt-2.log").write_text("re-formed\npartial")

    monkeypatch.setattr(main.time, "sleep", between_reads)

    assert run(run_dir, "logs", "j1", "--shard", "1", "--follow") == 0

    # The first read holds back a line not ended yet; a new attempt flushes the old log first; the job's end, the last.
    out = capsys.readouterr().out.splitlines()
    assert out == ["s1 a1 only", "no newline yet now ended", "last words", "re-formed", "partial"]


def test_new_commands_parse() -> None:
    args = main.parser().parse_args(["logs", "j1", "--shard", "2", "--attempt", "3", "-f"])
    assert (args.job, args.shard, args.attempt, args.follow, args.log_dir) == ("j1", 2, 3, True, None)
    assert main.parser().parse_args(["top", "--once"]).once is True
    assert main.parser().parse_args(["alerts", "--json"]).output == "json"  # the older spelling of -o json


def test_the_run_dir_comes_after_the_subcommand_too_and_up_remembers_the_cluster_for_every_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardyard.cli.main import parser
    from shardyard.cli.rundir import remember, run_dir_of

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("SHARDYARD_RUN_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert run_dir_of(parser().parse_args(["up", "--run-dir", "x"])) == Path("x")
    assert run_dir_of(parser().parse_args(["--run-dir", "y", "status"])) == Path("y")
    assert run_dir_of(parser().parse_args(["status"])) == Path(".shardyard")  # nothing recorded yet
    elsewhere = tmp_path / "cluster-a"
    elsewhere.mkdir()
    (elsewhere / "cluster.json").write_text("{}")
    remember(elsewhere)
    assert run_dir_of(parser().parse_args(["status"])) == elsewhere.resolve()
    (tmp_path / ".shardyard").mkdir()
    (tmp_path / ".shardyard" / "cluster.json").write_text("{}")
    assert run_dir_of(parser().parse_args(["status"])) == Path(".shardyard")  # one running here wins


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    import subprocess
    import sys

    info = ClusterInfo(
        str(tmp_path), "127.0.0.1:1", "", str(tmp_path), True, 0.0, pids={f"node-{i}": 1 for i in range(5000)}
    )
    info.save()
    piped = subprocess.run(
        f"{sys.executable} -m shardyard.cli.main --run-dir {tmp_path} ps | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert piped.stdout.startswith("PROCESS")
    assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr, piped.stderr


def test_the_cli_starts_without_the_heavy_libraries() -> None:
    """A command that reads the monitor answers in well under 300 ms: building the parser loads neither pydantic
    (the event models), nor Kafka's client, nor torch; the commands that need them import them when they run."""
    import subprocess
    import sys

    heavy = ("pydantic", "aiokafka", "torch", "psycopg", "prometheus_client", "faststream", "numpy")
    probe = (
        "import sys, shardyard.cli.main as m; m.parser(); "
        f"print(sorted({{n.split('.')[0] for n in sys.modules}} & {set(heavy)!r}))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr


def test_history_shows_the_limit_the_query_applies() -> None:
    from shardyard.cli import history
    from shardyard.jobdb import query

    assert history.DEFAULT_LIMIT == query.DEFAULT_LIMIT


def test_history_offers_every_output_it_renders() -> None:
    from shardyard.cli import history, history_render

    assert tuple(history_render.OUTPUTS) == history.OUTPUT_NAMES
