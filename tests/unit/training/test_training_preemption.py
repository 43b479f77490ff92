"""Stop requests in one process: the signal flag, and a one-rank runner that checkpoints, stops and resumes."""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardyard.training import exitcodes
from shardyard.training.artifacts import DemoArtifacts, create_demo_artifacts
from shardyard.training.checkpoint import STATE_FILE, load_checkpoint
from shardyard.training.model import TinyGPTConfig, load_pretrained
from shardyard.training.preemption import STOP_SIGNAL, StopFlag, checkpoint_job_path
from shardyard.training.runner import main

TINY = TinyGPTConfig(n_positions=32, n_embd=16, n_layer=1, n_head=2)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> DemoArtifacts:
    return create_demo_artifacts(tmp_path_factory.mktemp("data"), model_config=TINY, text_bytes=20_000)


@pytest.fixture
def restore_stop_signal() -> Iterator[None]:
    handler = signal.getsignal(STOP_SIGNAL)
    yield
    signal.signal(STOP_SIGNAL, handler)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(artifacts: DemoArtifacts, output: Path, **extra: str) -> dict[str, str]:
    return {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_port()),
        "SHARDYARD_MODEL_DIR": str(artifacts.model_dir),
        "SHARDYARD_DATASET_DIR": str(artifacts.dataset_dir),
        "SHARDYARD_OUTPUT_DIR": str(output),
        "SHARDYARD_SYNC_INTERVAL": "5",
        "SHARDYARD_MAX_STEPS": "20",
        "SHARDYARD_BATCH_SIZE": "2",
        "SHARDYARD_SEQ_LEN": "16",
        "SHARDYARD_LR": "1e-2",
        "SHARDYARD_SEED": "3",
        **extra,
    }


def _requested() -> StopFlag:
    flag = StopFlag()
    flag.request()
    return flag


def test_the_signal_raises_the_flag(restore_stop_signal: None) -> None:
    flag = StopFlag.install()
    assert not flag.requested

    os.kill(os.getpid(), STOP_SIGNAL)

    assert flag.requested


def test_checkpoint_job_path() -> None:
    assert checkpoint_job_path("/data/checkpoints/job-1/") == "/data/checkpoints/job-1/checkpoint"


def test_one_rank_stops_at_once_not_at_its_next_sync_then_resumes_to_max_steps(
    artifacts: DemoArtifacts, tmp_path: Path
) -> None:
    """Asked before its first step, it checkpoints after it: the next sync (step 5) is not waited for."""
    output = tmp_path / "out"

    assert main(_env(artifacts, output), _requested()) == exitcodes.PREEMPTED

    checkpoint = output / "checkpoint"
    state = json.loads((checkpoint / STATE_FILE).read_text())
    assert state["step"] == 1 and state["world_size"] == 1 and state["seed"] == 3
    assert load_checkpoint(checkpoint).optimizer is not None

    env = _env(artifacts, output, SHARDYARD_RESUME_DIR=str(checkpoint))
    assert main(env, StopFlag()) == exitcodes.OK
    assert load_pretrained(output).config == TINY
    # The final model replaced the output directory; the last checkpoint was carried into it.
    assert json.loads((checkpoint / STATE_FILE).read_text())["step"] >= 1


def test_a_stop_at_the_last_step_finishes_instead(artifacts: DemoArtifacts, tmp_path: Path) -> None:
    env = _env(artifacts, tmp_path / "out", SHARDYARD_MAX_STEPS="1")

    assert main(env, _requested()) == exitcodes.OK
    assert not (tmp_path / "out" / "checkpoint").exists()


def test_a_checkpoint_past_max_steps_is_a_user_error(
    artifacts: DemoArtifacts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "out"
    assert main(_env(artifacts, output), StopFlag()) == exitcodes.OK  # its last checkpoint (step 15) is kept inside

    env = _env(artifacts, tmp_path / "again", SHARDYARD_MAX_STEPS="4", SHARDYARD_RESUME_DIR=str(output / "checkpoint"))

    assert main(env, StopFlag()) == exitcodes.USER_ERROR
    assert "past SHARDYARD_MAX_STEPS=4" in capsys.readouterr().err


def test_a_missing_resume_checkpoint_is_a_user_error(artifacts: DemoArtifacts, tmp_path: Path) -> None:
    env = _env(artifacts, tmp_path / "out", SHARDYARD_RESUME_DIR=str(tmp_path / "nothing"))

    assert main(env, StopFlag()) == exitcodes.USER_ERROR
