"""Real multi-process runs of ``python -m shardyard.training.runner`` over gloo on localhost (no broker)."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from shardyard.training import exitcodes
from shardyard.training.artifacts import DemoArtifacts, create_demo_artifacts
from shardyard.training.exitcodes import ExitCause, classify_exit
from shardyard.training.model import TinyGPTConfig, load_pretrained

# Smaller than the default TinyGPT so that 300 steps take a few seconds on 2 CPU cores.
TEST_MODEL = TinyGPTConfig(n_positions=64, n_embd=32, n_layer=1, n_head=2)
RUN_DEADLINE_S = 120.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Shard:
    rank: int
    proc: subprocess.Popen[bytes]
    stderr_path: Path
    lines: list[dict[str, Any]] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)  # time.monotonic() of each line
    got_line: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None

    def read_progress_pipe(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as f:
            for raw in f:  # whole JSON lines; EOF once the child has exited
                self.lines.append(json.loads(raw))
                self.arrived.append(time.monotonic())
                self.got_line.set()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def progress(self) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["kind"] == "progress"]


Launcher = Callable[..., list[Shard]]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> DemoArtifacts:
    return create_demo_artifacts(tmp_path_factory.mktemp("data"), seed=0, model_config=TEST_MODEL)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launcher]:
    """Start runner processes torchrun-style, each with its own progress pipe; kills leftovers at teardown."""
    shards: list[Shard] = []

    def _launch(world_size: int, overrides: dict[str, str], ranks: list[int] | None = None) -> list[Shard]:
        port = str(_free_port())
        started: list[Shard] = []
        for rank in range(world_size) if ranks is None else ranks:
            r, w = os.pipe()
            env = {
                **os.environ,
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "SHARDYARD_PROGRESS_FD": str(w),
                "SHARDYARD_DIST_TIMEOUT_S": "30",
                "OMP_NUM_THREADS": "1",
                **overrides,
            }
            stderr_path = tmp_path / f"rank{rank}.log"
            with open(stderr_path, "wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "shardyard.training.runner"],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=(w,),
                )
            os.close(w)  # the child holds the only write end now
            shard = Shard(rank=rank, proc=proc, stderr_path=stderr_path)
            shard.reader = threading.Thread(target=shard.read_progress_pipe, args=(r,), daemon=True)
            shard.reader.start()
            started.append(shard)
        shards.extend(started)
        return started

    yield _launch
    for shard in shards:
        if shard.proc.poll() is None:
            shard.proc.kill()
            shard.proc.wait()


def _wait(shard: Shard, timeout_s: float) -> int:
    try:
        rc = shard.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"rank {shard.rank} still running after {timeout_s:.0f} s; log:\n{shard.stderr()}")
    assert shard.reader is not None
    shard.reader.join(timeout=10)
    return rc


def _train_env(artifacts: DemoArtifacts, output_dir: Path, **extra: str) -> dict[str, str]:
    return {
        "SHARDYARD_MODEL_DIR": str(artifacts.model_dir),
        "SHARDYARD_DATASET_DIR": str(artifacts.dataset_dir),
        "SHARDYARD_OUTPUT_DIR": str(output_dir),
        "SHARDYARD_SYNC_INTERVAL": "100",
        "SHARDYARD_MAX_STEPS": "300",
        "SHARDYARD_BATCH_SIZE": "8",
        "SHARDYARD_SEQ_LEN": "64",
        "SHARDYARD_LR": "3e-3",
        "SHARDYARD_SEED": "1",
        **extra,
    }


def test_two_shards_train_sync_and_save(artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path) -> None:
    output_dir = tmp_path / "out" / "final"
    t0 = time.monotonic()
    shards = launch(2, _train_env(artifacts, output_dir))
    deadline = t0 + RUN_DEADLINE_S
    rcs = [_wait(shard, deadline - time.monotonic()) for shard in shards]
    elapsed = time.monotonic() - t0
    assert rcs == [exitcodes.OK, exitcodes.OK], "\n".join(s.stderr() for s in shards)

    for shard in shards:
        kinds = [line["kind"] for line in shard.lines]
        assert kinds[0] == "started" and kinds[-1] == "finished" and set(kinds[1:-1]) == {"progress"}
        assert shard.lines[0] == {"kind": "started", "world_size": 2, "rank": shard.rank}
        progress = shard.progress()
        assert progress[-1]["syncs"] >= 3
        sync_lines = [p for p in progress if p["step"] in (100, 200, 300)]
        assert [p["syncs"] for p in sync_lines] == [1, 2, 3]  # forced lines on every sync
        assert all(p["allreduce_bytes"] > 0 for p in sync_lines)
        assert progress[-1]["loss"] < progress[0]["loss"]
        assert progress[-1]["step"] == 300
        finished = shard.lines[-1]
        assert finished["steps"] == 300
        assert finished["checkpoint_dir"] == (str(output_dir) if shard.rank == 0 else None)

    assert load_pretrained(output_dir).config == TEST_MODEL
    rank0 = shards[0]
    train_s = rank0.arrived[-1] - rank0.arrived[0]  # "started" (after the rendezvous) .. "finished"
    print(
        f"\n2 shards x 300 steps: {elapsed:.2f} s wall from Popen to exit; rank 0 start-up"
        f" {rank0.arrived[0] - t0:.2f} s, training {train_s:.2f} s = {1000 * train_s / 300:.1f} ms/step"
    )


def _until(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.02)


def test_a_stop_signal_to_one_shard_stops_both_at_one_sync_and_the_gang_resumes(
    artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path
) -> None:
    output_dir = tmp_path / "out"
    checkpoint = output_dir / "checkpoint"
    env = _train_env(artifacts, output_dir, SHARDYARD_MAX_STEPS="1000000", SHARDYARD_SYNC_INTERVAL="10")
    rank0, rank1 = launch(2, env)
    _until(lambda: any(p["step"] >= 30 for p in rank1.progress()), 60, "rank 1 at step 30")
    seen = max(p["step"] for p in rank1.progress())
    rank1.proc.send_signal(signal.SIGUSR1)  # only rank 1 is asked; rank 0 learns it at the next sync

    rcs = [_wait(shard, 60) for shard in (rank0, rank1)]

    assert rcs == [exitcodes.PREEMPTED, exitcodes.PREEMPTED], "\n".join(s.stderr() for s in (rank0, rank1))
    assert classify_exit(exitcodes.PREEMPTED) is ExitCause.PREEMPTED
    ends = [shard.lines[-1] for shard in (rank0, rank1)]
    stop_step = ends[0]["step"]
    assert ends == [
        {"kind": "preempted", "step": stop_step, "checkpoint_dir": str(checkpoint)},
        {"kind": "preempted", "step": stop_step, "checkpoint_dir": None},
    ]
    assert stop_step % 10 == 0 and stop_step > seen
    assert [shard.progress()[-1]["step"] for shard in (rank0, rank1)] == [stop_step, stop_step]
    state = json.loads((checkpoint / "state.json").read_text())
    assert (state["step"], state["world_size"], state["sync_interval"]) == (stop_step, 2, 10)
    assert load_pretrained(checkpoint).config == TEST_MODEL
    assert (checkpoint / "optimizer.pt").is_file()
    first_loss = rank0.progress()[0]["loss"]

    max_steps = stop_step + 100
    resumed = launch(
        2,
        _train_env(
            artifacts,
            output_dir,
            SHARDYARD_MAX_STEPS=str(max_steps),
            SHARDYARD_SYNC_INTERVAL="10",
            SHARDYARD_RESUME_DIR=str(checkpoint),
        ),
    )
    rcs = [_wait(shard, RUN_DEADLINE_S) for shard in resumed]

    assert rcs == [exitcodes.OK, exitcodes.OK], "\n".join(s.stderr() for s in resumed)
    for shard in resumed:
        progress = shard.progress()
        assert progress[0]["step"] == stop_step + 1 and progress[-1]["step"] == max_steps
        losses = [p["loss"] for p in progress]
        assert all(loss is not None and math.isfinite(loss) for loss in losses)
        # The weights were restored (the first loss is far below a fresh model's) and training went on improving.
        assert losses[0] < first_loss - 0.5 and losses[-1] < first_loss - 0.5
        finished = shard.lines[-1]
        assert finished["kind"] == "finished" and finished["steps"] == max_steps
        assert math.isfinite(finished["final_loss"]) and finished["final_loss"] < first_loss - 0.5
    assert load_pretrained(output_dir).config == TEST_MODEL
    print(
        f"\nstopped at step {stop_step} (signal after step {seen}); first loss {first_loss:.3f}, resumed"
        f" {resumed[0].progress()[0]['loss']:.3f} -> {resumed[0].progress()[-1]['loss']:.3f} at step {max_steps}"
    )


def test_missing_model_dir_exits_user_error(artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path) -> None:
    env = _train_env(artifacts, tmp_path / "out", SHARDYARD_MODEL_DIR=str(tmp_path / "no-such-model"))
    (shard,) = launch(2, env, ranks=[0])  # its peer never starts: the input check comes before the rendezvous
    assert _wait(shard, 60) == exitcodes.USER_ERROR
    assert "does not exist" in shard.stderr()
    assert shard.lines == []


def test_sigterm_ends_a_shard_promptly_and_its_peer_exits_comm_error(
    artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path
) -> None:
    env = _train_env(artifacts, tmp_path / "out", SHARDYARD_MAX_STEPS="1000000", SHARDYARD_SYNC_INTERVAL="10")
    rank0, rank1 = launch(2, env)
    for shard in (rank0, rank1):
        assert shard.got_line.wait(timeout=60), f"rank {shard.rank} never reported:\n{shard.stderr()}"
    t_kill = time.monotonic()
    rank1.proc.send_signal(signal.SIGTERM)
    assert _wait(rank1, 10) == -signal.SIGTERM
    assert classify_exit(rank1.proc.returncode) is ExitCause.KILLED
    assert _wait(rank0, 30) == exitcodes.COMM_ERROR, rank0.stderr()
    assert classify_exit(rank0.proc.returncode) is ExitCause.COMM_ERROR
    assert "communication error" in rank0.stderr()
    print(f"\npeer exited COMM_ERROR {time.monotonic() - t_kill:.2f} s after SIGTERM")


def test_rendezvous_timeout_exits_comm_error(artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path) -> None:
    env = _train_env(artifacts, tmp_path / "out", SHARDYARD_DIST_TIMEOUT_S="1")
    (shard,) = launch(2, env, ranks=[0])  # rank 1 never shows up
    assert _wait(shard, 60) == exitcodes.COMM_ERROR, shard.stderr()
    assert "init_process_group" in shard.stderr()
    assert shard.lines == []
