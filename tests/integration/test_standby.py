"""Warm standbys as real processes, started by the agent's launcher: one trains as a shard once given its order
(its log, its environment, its progress channel), one discarded ends without training, one given a bad order fails
with a typed exit code. No broker: the launcher is the seam under test."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from shardyard.node_agent.environment import PROGRESS_FD_ENV
from shardyard.node_agent.launcher import LaunchSpec, SubprocessLauncher
from shardyard.training import exitcodes, standby
from shardyard.training.artifacts import DemoArtifacts, create_demo_artifacts
from shardyard.training.model import TinyGPTConfig, load_pretrained
from tests.support import wait
from tests.support.runners import free_port, train_env

TEST_MODEL = TinyGPTConfig(n_positions=64, n_embd=32, n_layer=1, n_head=2)
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> DemoArtifacts:
    return create_demo_artifacts(tmp_path_factory.mktemp("data"), seed=0, model_config=TEST_MODEL)


def _spec(tmp_path: Path) -> LaunchSpec:
    return LaunchSpec(
        argv=(sys.executable, "-m", standby.MODULE),
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=Path.cwd(),
        log_path=tmp_path / "standby.log",
    )


async def _until(condition: Callable[[], bool], what: str) -> None:
    await wait.eventually(condition, what, DEADLINE_S)


async def _warm(log: Path) -> None:
    """Until the standby says it is warm (it then waits for its order)."""
    await _until(lambda: log.exists() and "waiting for an order" in log.read_text(), "the standby to be warm")


def test_a_standby_trains_as_the_shard_its_order_names(artifacts: DemoArtifacts, tmp_path: Path) -> None:
    output = tmp_path / "out"
    shard_log = tmp_path / "shard-0-attempt-2.log"
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
        **train_env(artifacts, output, SHARDYARD_DEVICE="cpu", SHARDYARD_MAX_STEPS="40", SHARDYARD_SYNC_INTERVAL="1"),
    }

    async def run() -> tuple[int, list[dict[str, object]], int, int]:
        spec = _spec(tmp_path)
        warm = await SubprocessLauncher().standby(spec, progress_env=PROGRESS_FD_ENV)
        await _warm(spec.log_path)
        shard = await warm.go(standby.Order(env=env, log=str(shard_log)).encode())
        async with asyncio.timeout(DEADLINE_S):
            lines = [json.loads(line) async for line in shard.progress()]
            return await shard.wait(), lines, warm.pid, shard.pid

    code, lines, standby_pid, shard_pid = asyncio.run(run())
    log = shard_log.read_text()
    assert code == exitcodes.OK, log
    assert standby_pid == shard_pid  # the same process: nothing was started cold
    kinds = [line["kind"] for line in lines]
    assert kinds[0] == "started" and kinds[-1] == "finished", kinds
    assert lines[-1]["steps"] == 40
    assert "training on cpu over gloo" in log  # the runner's output went to the order's log, not the standby's
    assert "training on" not in (tmp_path / "standby.log").read_text()
    assert load_pretrained(output).config == TEST_MODEL


def test_a_discarded_standby_ends_without_training(tmp_path: Path) -> None:
    async def run() -> int:
        spec = _spec(tmp_path)
        warm = await SubprocessLauncher().standby(spec, progress_env=PROGRESS_FD_ENV)
        await _warm(spec.log_path)
        assert warm.alive()
        warm.discard()
        await _until(lambda: not warm.alive(), "the discarded standby to end")
        with pytest.raises(OSError, match="gone"):
            await warm.go(b"{}\n")
        return 0

    asyncio.run(run())


def test_a_bad_order_is_an_internal_error(tmp_path: Path) -> None:
    async def run() -> int:
        warm = await SubprocessLauncher().standby(_spec(tmp_path), progress_env=PROGRESS_FD_ENV)
        shard = await warm.go(b'{"env": {"A": 1}, "log": "x"}\n')
        async with asyncio.timeout(DEADLINE_S):
            return await shard.wait()

    assert asyncio.run(run()) == exitcodes.INTERNAL_ERROR
    assert "bad order: 'env' must map names to strings" in (tmp_path / "standby.log").read_text()
