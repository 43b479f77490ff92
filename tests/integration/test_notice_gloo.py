"""Checkpoint on notice with the built-in runner: two real ranks over gloo on localhost (no broker), their next
parameter sync far away (interval 1000). Both get the notice, as the agent sends it to every shard: they stop
together within a few steps of it, not at the sync, rank 0 checkpoints there, and a new gang resumes from that step."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardyard.training import exitcodes
from shardyard.training.artifacts import DemoArtifacts, create_demo_artifacts
from shardyard.training.model import TinyGPTConfig
from tests.support.runners import Launcher, runners, train_env, until, wait_exit

TEST_MODEL = TinyGPTConfig(n_positions=64, n_embd=32, n_layer=1, n_head=2)
INTERVAL = 1000


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> DemoArtifacts:
    return create_demo_artifacts(tmp_path_factory.mktemp("data"), seed=0, model_config=TEST_MODEL)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launcher]:
    with runners(tmp_path) as start:
        yield start


def test_a_notice_to_every_rank_stops_the_gang_at_once_between_syncs_and_it_resumes_there(
    artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path
) -> None:
    output = tmp_path / "out"
    env = train_env(
        artifacts, output, SHARDYARD_DEVICE="cpu", SHARDYARD_MAX_STEPS="100000", SHARDYARD_SYNC_INTERVAL=str(INTERVAL)
    )
    shards = launch(2, env)
    until(lambda: all(s.progress() and s.progress()[-1]["step"] >= 20 for s in shards), 60, "both ranks at step 20")
    noticed = [s.progress()[-1]["step"] for s in shards]  # each rank reports every step it completes... at most
    sent = time.monotonic()
    for shard in shards:
        shard.proc.send_signal(signal.SIGUSR1)

    codes = [wait_exit(shard, 60) for shard in shards]
    took = time.monotonic() - sent

    assert codes == [exitcodes.PREEMPTED] * 2, "\n".join(s.stderr() for s in shards)
    ends = [shard.lines[-1] for shard in shards]
    stop = ends[0]["step"]
    assert ends == [
        {"kind": "preempted", "step": stop, "checkpoint_dir": str(output / "checkpoint")},
        {"kind": "preempted", "step": stop, "checkpoint_dir": None},
    ]
    assert max(noticed) <= stop < INTERVAL  # no step of the notice lost, and not the next sync
    assert json.loads((output / "checkpoint" / "state.json").read_text())["step"] == stop
    print(f"\nnotice after steps {noticed} (last reported), stopped at step {stop}, {took:.2f} s after the notice")
    assert took < 10

    resumed = launch(
        2,
        train_env(
            artifacts,
            output,
            SHARDYARD_DEVICE="cpu",
            SHARDYARD_MAX_STEPS=str(stop + 5),
            SHARDYARD_SYNC_INTERVAL=str(INTERVAL),
            SHARDYARD_RESUME_DIR=str(output / "checkpoint"),
        ),
    )
    assert [wait_exit(shard, 60) for shard in resumed] == [exitcodes.OK] * 2, "\n".join(s.stderr() for s in resumed)
    assert [shard.progress()[0]["step"] for shard in resumed] == [stop + 1] * 2
