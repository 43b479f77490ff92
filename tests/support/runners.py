"""Shard runners (``python -m shardyard.training.runner``) as real processes on localhost, torchrun-style, each
with its own progress pipe read on a thread; no agent, no broker."""

from __future__ import annotations

import contextlib
import json
import os
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

from shardyard.training.artifacts import DemoArtifacts
from tests.support import wait


def free_port() -> int:
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

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [line for line in list(self.lines) if line["kind"] == kind]

    def progress(self) -> list[dict[str, Any]]:
        return self.of("progress")

    def sync_lines(self) -> list[dict[str, Any]]:
        """The progress line written at each sync (forced there): the first line with each ``syncs`` count."""
        first: dict[int, dict[str, Any]] = {}
        for line in self.progress():
            first.setdefault(line["syncs"], line)
        return [line for syncs, line in sorted(first.items()) if syncs > 0]


Launcher = Callable[..., list[Shard]]


@contextlib.contextmanager
def runners(tmp_path: Path) -> Iterator[Launcher]:
    """``launch(world_size, env_overrides, ranks=None, rank_env=None)`` starts runner processes (``rank_env``: more
    variables for some ranks); leftovers are killed at the end."""
    shards: list[Shard] = []

    def launch(
        world_size: int,
        overrides: dict[str, str],
        ranks: list[int] | None = None,
        rank_env: dict[int, dict[str, str]] | None = None,
    ) -> list[Shard]:
        port = str(free_port())
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
                **(rank_env or {}).get(rank, {}),
            }
            stderr_path = tmp_path / f"rank{rank}-{time.monotonic_ns()}.log"
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

    try:
        yield launch
    finally:
        for shard in shards:
            if shard.proc.poll() is None:
                shard.proc.kill()
                shard.proc.wait()


def wait_exit(shard: Shard, timeout_s: float) -> int:
    try:
        rc = shard.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"rank {shard.rank} still running after {timeout_s:.0f} s; log:\n{shard.stderr()}")
    assert shard.reader is not None
    shard.reader.join(timeout=10)
    return rc


def until(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    wait.until(condition, what, timeout_s, every_s=0.02)


def train_env(artifacts: DemoArtifacts, output_dir: Path, **extra: str) -> dict[str, str]:
    """A runner environment (sync every 100 of 300 steps). The slow-sync factor is huge: a loaded test machine must
    not widen the interval of tests that count on it; tests of the pacing set their own."""
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
        "SHARDYARD_SLOW_SYNC_FACTOR": "1000",
        **extra,
    }
