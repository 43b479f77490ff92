"""An elastic gang re-formed at another world size from its members' live state, with real runner processes over
gloo on localhost (no broker, the CPU): the old gang is revoked with SIGTERM, as the scheduler does when it resizes
a job, every member keeps the gang's state on its node, and the new gang (the old nodes and new ones, with the same
``SHARDYARD_GLOBAL_BATCH``) resumes at the step reached and trains as a gang of fixed size would have."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardyard.training import exitcodes
from shardyard.training.artifacts import DemoArtifacts, create_demo_artifacts
from shardyard.training.config import GLOBAL_BATCH_ENV, PEER_STATE_DIR_ENV
from shardyard.training.model import TinyGPTConfig
from shardyard.training.runner import TERMINATED_EXIT
from tests.support.runners import Launcher, Shard, runners, train_env, until
from tests.support.runners import wait_exit as _wait

TEST_MODEL = TinyGPTConfig(n_positions=64, n_embd=32, n_layer=1, n_head=2)
GLOBAL_BATCH = 8
MORE_STEPS = 20
"""Steps the resized gang trains after resuming."""
RUN_DEADLINE_S = 120.0
LOSS_TOLERANCE = 1e-3
"""Relative: far tighter than a lost step or a shifted data stream would allow (the sums differ in order only)."""


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> DemoArtifacts:
    return create_demo_artifacts(tmp_path_factory.mktemp("data"), seed=0, model_config=TEST_MODEL)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launcher]:
    with runners(tmp_path) as start:
        yield start


def _env(artifacts: DemoArtifacts, output_dir: Path, **extra: str) -> dict[str, str]:
    """Gradient averaging (the update of the whole global batch at every size), no periodic checkpoint: only the
    members' kept state can carry the gang over."""
    run = {
        "SHARDYARD_DEVICE": "cpu",
        "SHARDYARD_SYNC_INTERVAL": "1",
        "SHARDYARD_CHECKPOINT_EVERY": "0",
        GLOBAL_BATCH_ENV: str(GLOBAL_BATCH),
    }
    return train_env(artifacts, output_dir, **run, **extra)


def _revoked(shards: list[Shard], nodes: list[Path]) -> int:
    """SIGTERM every member, as the scheduler revokes the old attempt; returns the step of the state they kept."""
    for shard in shards:
        shard.proc.send_signal(signal.SIGTERM)
    rcs = [_wait(shard, 30) for shard in shards]
    assert set(rcs) <= {TERMINATED_EXIT, exitcodes.COMM_ERROR}, "\n".join(s.stderr() for s in shards)
    kept = [
        json.loads((node / f"rank-{s.rank}" / "state.json").read_text()) for s, node in zip(shards, nodes, strict=True)
    ]
    assert all(k["world_size"] == len(shards) and k["attempt"] == 1 for k in kept)
    step = max(k["step"] for k in kept)
    assert step >= max(p["step"] for s in shards for p in s.progress())  # no step it reported is lost
    return int(step)


@pytest.mark.parametrize(("old", "new"), [(2, 4), (4, 2)], ids=["grow-2-to-4", "shrink-4-to-2"])
def test_a_resized_gang_resumes_from_its_members_state_and_trains_as_a_fixed_size_gang(
    artifacts: DemoArtifacts, launch: Launcher, tmp_path: Path, old: int, new: int
) -> None:
    nodes = [tmp_path / f"node-{n}" / "peer-state" for n in range(max(old, new))]
    at = {rank: {PEER_STATE_DIR_ENV: str(nodes[rank])} for rank in range(max(old, new))}  # rank r on node r
    output_dir = tmp_path / "out"
    t0 = time.monotonic()
    before = launch(old, _env(artifacts, output_dir, SHARDYARD_MAX_STEPS="1000000", SHARDYARD_ATTEMPT="1"), rank_env=at)
    until(lambda: all(s.progress() and s.progress()[-1]["step"] >= 15 for s in before), 60, "15 steps")
    step = _revoked(before, nodes[:old])

    max_steps = str(step + MORE_STEPS)
    after = launch(new, _env(artifacts, output_dir, SHARDYARD_MAX_STEPS=max_steps, SHARDYARD_ATTEMPT="2"), rank_env=at)
    fixed = launch(new, _env(artifacts, tmp_path / "fixed", SHARDYARD_MAX_STEPS=max_steps))
    rcs = [_wait(shard, RUN_DEADLINE_S) for shard in [*after, *fixed]]

    assert rcs == [exitcodes.OK] * (2 * new), "\n".join(s.stderr() for s in [*after, *fixed])
    for shard in after:
        old_rank = shard.rank % old
        assert f"resuming from its peers' state of step {step} (attempt 1;" in shard.stderr()
        assert f"of a gang of {old}, rank {old_rank}'s)" in shard.stderr()
        assert shard.progress()[0]["step"] == step + 1 and shard.lines[-1]["steps"] == step + MORE_STEPS
    # The same windows every step and the same update (the mean loss over the global batch) at either size: each
    # rank ends with the loss of its slice that the gang of fixed size gets, but for the order of float sums.
    losses = [(a.lines[-1]["final_loss"], f.lines[-1]["final_loss"]) for a, f in zip(after, fixed, strict=True)]
    assert all(abs(a - f) <= LOSS_TOLERANCE * f for a, f in losses), losses
    print(
        f"\n{old} -> {new} ranks at step {step}, {MORE_STEPS} more steps: final losses (resized, fixed) {losses};"
        f" {time.monotonic() - t0:.1f} s"
    )
