"""The built-in runner works unmodified under plain torchrun (``bench/training.py``'s baseline), not only under our
node agent: torchrun's elastic agent hosts the gang's store on MASTER_ADDR:MASTER_PORT itself and says so with
``TORCHELASTIC_USE_AGENT_STORE=True``, so rank 0 must connect to it as a client. A rank 0 that bound the port
itself died in ``init_process_group`` with "Address already in use"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shardyard.training.artifacts import DemoArtifacts, create_demo_artifacts
from shardyard.training.model import TinyGPTConfig
from tests.support.runners import train_env

TINY = TinyGPTConfig(n_positions=32, n_embd=16, n_layer=1, n_head=2)
RUN_TIMEOUT_S = 90.0
"""A generous bound for a run that takes 10-15 s on a loaded 2-core host: a hung rendezvous fails the test, not CI."""


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> DemoArtifacts:
    return create_demo_artifacts(tmp_path_factory.mktemp("data"), seed=0, model_config=TINY, text_bytes=4_000)


def torchrun(argv: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run torchrun in a session of its own, so that a run past ``timeout_s`` takes its workers down with it."""
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun still running after {timeout_s} s:\n{out[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out)


def test_a_gang_trains_under_plain_torchrun(artifacts: DemoArtifacts, tmp_path: Path) -> None:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("SHARDYARD_", "TORCHELASTIC_"))}
    knobs = {"SHARDYARD_DEVICE": "cpu", "SHARDYARD_DIST_TIMEOUT_S": "30", "SHARDYARD_SYNC_INTERVAL": "1"}
    knobs |= {"SHARDYARD_MAX_STEPS": "3", "SHARDYARD_BATCH_SIZE": "2", "SHARDYARD_SEQ_LEN": "16"}
    env = {**inherited, "OMP_NUM_THREADS": "1", **train_env(artifacts, tmp_path / "out", **knobs)}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    argv += ["-m", "shardyard.training.shard"]  # as bench/training.py runs it (``torchrun`` is this module)

    run = torchrun(argv, env, RUN_TIMEOUT_S)

    assert run.returncode == 0, run.stdout[-3000:]
    assert "Address already in use" not in run.stdout
    for rank in (0, 1):
        assert f"[rank {rank}/2]: trained steps 1..3" in run.stdout, run.stdout[-3000:]
