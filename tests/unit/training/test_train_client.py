"""The ``shardyard.train`` client: a no-op outside Shardyard; under it, progress and checkpoints through the runtime's
channel, a save/restore round trip, and the stop request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from shardyard import train
from shardyard.training.preemption import RESUME_DIR_ENV, STOP_SIGNAL


@pytest.fixture(autouse=True)
def _stop_signal_restored() -> Iterator[None]:
    """The client takes the stop signal in the main thread (pytest's): give it back afterwards."""
    handler = signal.getsignal(STOP_SIGNAL)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    yield
    signal.signal(STOP_SIGNAL, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class Channel:
    """The agent's end of a progress pipe."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()

    def lines(self) -> list[dict[str, Any]]:
        """Every line written so far (the runtime under test must have closed its end)."""
        with os.fdopen(self.read_fd, "rb") as reader:
            return [json.loads(line) for line in reader]


@pytest.fixture
def channel() -> Channel:
    return Channel()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def test_importing_the_client_does_not_import_torch() -> None:
    code = "import sys, shardyard.train; assert 'torch' not in sys.modules, 'torch imported'"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, check=False).returncode == 0


def test_outside_shardyard_every_call_is_a_no_op(tmp_path: Path) -> None:
    runtime = train.Runtime({})
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]

    runtime.report(1, 0.5, samples=8)
    stats = runtime.average_parameters(model)

    assert not runtime.sync_due(100)
    assert (stats.bytes, stats.stop) == (0, False)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert runtime.checkpoint_dir() is None
    assert runtime.save({"x": torch.ones(1)}, 1) is None
    assert runtime.restore() is None
    assert not runtime.stop_requested()
    assert runtime.preempted(1) == train.PREEMPTED
    assert signal.getsignal(STOP_SIGNAL) is not None  # untouched: the script's own handler, if any, stays
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("interval", "steps"), [("10", [10, 20]), ("7", [7, 14]), ("1", list(range(1, 21))), ("0", []), ("x", [])], ids=str
)
def test_sync_due(interval: str, steps: list[int]) -> None:
    runtime = train.Runtime({"SHARDYARD_SYNC_INTERVAL": interval})

    assert [step for step in range(0, 21) if runtime.sync_due(step)] == steps


def test_reports_reach_the_progress_channel(channel: Channel) -> None:
    runtime = train.Runtime({"SHARDYARD_PROGRESS_FD": str(channel.write_fd), "RANK": "1"})

    runtime.report(1, 2.0, samples=8)
    runtime.report(2, 1.0, samples=8)  # within 0.5 s: folded into the next line
    runtime.report(3, 0.5, samples=8)
    runtime.finish()  # writes the folded steps first
    runtime.finish()  # once only (it also runs at exit)

    first, last, finished = channel.lines()
    assert (first["kind"], first["step"], first["loss"], first["syncs"]) == ("progress", 1, 2.0, 0)
    assert first["samples_per_s"] > 0
    assert (last["kind"], last["step"]) == ("progress", 3)
    assert finished == {"kind": "finished", "final_loss": 0.5, "steps": 3, "checkpoint_dir": None}


def test_a_sync_step_is_always_reported(channel: Channel) -> None:
    runtime = train.Runtime({"SHARDYARD_PROGRESS_FD": str(channel.write_fd), "SHARDYARD_SYNC_INTERVAL": "2"})

    for step in (1, 2, 3):
        runtime.report(step, 1.0)
    runtime.finish()

    assert [(line["kind"], line.get("step")) for line in channel.lines()] == [
        ("progress", 1),
        ("progress", 2),
        ("progress", 3),
        ("finished", None),
    ]


def test_save_and_restore_round_trip(tmp_path: Path, channel: Channel) -> None:
    directory = tmp_path / "out" / "checkpoint"
    env = {"SHARDYARD_CHECKPOINT_DIR": str(directory), "RANK": "0", "SHARDYARD_PROGRESS_FD": str(channel.write_fd)}
    runtime = train.Runtime(env)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()

    assert runtime.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "note": "a"}, 7) == directory
    runtime.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "note": "b"}, 9)
    runtime.finish()

    restored = train.Runtime({"SHARDYARD_CHECKPOINT_DIR": str(directory)}).restore()
    assert restored is not None
    state, step = restored
    assert (step, state["note"]) == (9, "b")
    assert all(torch.equal(state["model"][k], v) for k, v in model.state_dict().items())
    fresh = _model()
    torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9).load_state_dict(state["optimizer"])
    assert sorted(p.name for p in directory.parent.iterdir()) == ["checkpoint"]  # swapped in place, nothing left
    checkpointed = [line for line in channel.lines() if line["kind"] == "checkpointed"]
    assert [(line["step"], line["checkpoint_dir"]) for line in checkpointed] == [
        (7, str(directory)),
        (9, str(directory)),
    ]


def test_only_rank_0_saves(tmp_path: Path) -> None:
    runtime = train.Runtime({"SHARDYARD_CHECKPOINT_DIR": str(tmp_path / "checkpoint"), "RANK": "1"})

    assert runtime.save({"x": torch.ones(1)}, 1) is None
    assert not (tmp_path / "checkpoint").exists()


def test_restore_prefers_the_resume_dir(tmp_path: Path) -> None:
    train.Runtime({"SHARDYARD_CHECKPOINT_DIR": str(tmp_path / "a")}).save({"at": 3}, 3)
    train.Runtime({"SHARDYARD_CHECKPOINT_DIR": str(tmp_path / "b")}).save({"at": 9}, 9)
    env = {"SHARDYARD_CHECKPOINT_DIR": str(tmp_path / "b"), RESUME_DIR_ENV: str(tmp_path / "a")}

    assert train.Runtime(env).restore() == ({"at": 3}, 3)
    assert train.Runtime({**env, RESUME_DIR_ENV: str(tmp_path / "none")}).restore() == ({"at": 9}, 9)


def test_a_directory_that_is_not_a_client_checkpoint_is_not_restored(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "state.json").write_text("{}")  # the built-in runner's kind

    assert train.Runtime({"SHARDYARD_CHECKPOINT_DIR": str(tmp_path / "checkpoint")}).restore() is None


def test_a_stop_request_is_seen_and_reported_as_preempted(tmp_path: Path, channel: Channel) -> None:
    directory = tmp_path / "checkpoint"
    env = {"SHARDYARD_PROGRESS_FD": str(channel.write_fd), "SHARDYARD_CHECKPOINT_DIR": str(directory), "RANK": "0"}
    runtime = train.Runtime(env)
    runtime.report(1, 1.0)
    assert not runtime.stop_requested()

    os.kill(os.getpid(), STOP_SIGNAL)

    assert runtime.stop_requested()
    assert runtime.average_parameters(_model()).stop  # one rank: its own answer
    assert runtime.preempted(4) == train.PREEMPTED
    runtime.finish()  # nothing more after the stop
    lines = channel.lines()
    assert lines[-1] == {"kind": "preempted", "step": 4, "checkpoint_dir": str(directory)}
    assert [line["kind"] for line in lines] == ["progress", "preempted"]


def test_the_notice_its_seconds_and_what_is_left_of_them(channel: Channel) -> None:
    env = {"SHARDYARD_PROGRESS_FD": str(channel.write_fd), "SHARDYARD_NOTICE_S": "20.0", "RANK": "0"}
    runtime = train.Runtime(env)
    assert (runtime.notice_s(), runtime.notice_left(), runtime.stop_agreed()) == (20.0, None, False)

    os.kill(os.getpid(), STOP_SIGNAL)

    assert runtime.stop_agreed()  # one rank, no process group: its own answer
    left = runtime.notice_left()
    assert left is not None and 19.0 < left <= 20.0
    runtime.finish()


def test_outside_shardyard_there_is_no_notice() -> None:
    runtime = train.Runtime({})

    assert (runtime.notice_s(), runtime.notice_left(), runtime.stop_agreed()) == (None, None, False)
