"""Which state a re-formed gang resumes from: its survivors' snapshots or the checkpoint (pure logic, no gang)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardyard.training.config import RunConfig
from shardyard.training.peer_state import Offer, ResumePlan, choose, read_offers


def offer(step: int, ranks: tuple[int, ...], *, attempt: int = 1, where: str = "") -> Offer:
    return Offer(step=step, attempt=attempt, ranks=ranks, directory=where or f"/n/rank-{ranks[0]}")


def test_the_newest_step_that_holds_every_rank_wins_over_an_older_checkpoint() -> None:
    # Rank 1 was lost and came back on a new node: rank 0's snapshot holds both states, rank 2's its own and 1's.
    offers = [[offer(40, (0, 2), where="/a/rank-0")], [], [offer(40, (1, 2), where="/c/rank-2")]]

    plan = choose(20, offers, 3)

    sources = {0: (0, "/a/rank-0"), 1: (2, "/c/rank-2"), 2: (2, "/c/rank-2")}
    assert plan == ResumePlan(step=40, attempt=1, sources=sources)


def test_a_rank_takes_its_state_from_its_own_node_else_from_the_lowest_rank_holding_it() -> None:
    both = (0, 1)
    offers = [[offer(30, both, where="/a/rank-1")], [offer(30, both, where="/b/rank-0")]]

    plan = choose(0, offers, 2)

    assert plan is not None and plan.sources == {0: (0, "/a/rank-1"), 1: (1, "/b/rank-0")}


def test_the_checkpoint_wins_when_the_snapshots_are_not_newer() -> None:
    offers = [[offer(40, (0, 1))], []]
    assert choose(40, offers, 2) is None
    assert choose(60, offers, 2) is None


def test_a_step_missing_a_rank_falls_back_to_an_older_complete_one_then_to_the_checkpoint() -> None:
    # Ring neighbours 0 and 1 were both lost: rank 2's newest snapshot lacks rank 0's state.
    offers = [[], [], [offer(60, (1, 2)), offer(40, (0, 1), where="/c/old")]]
    assert choose(0, offers, 3) is None  # step 40 lacks rank 2's state too

    offers = [[offer(40, (0, 1, 2), where="/a/old")], [], [offer(60, (1, 2))]]
    plan = choose(20, offers, 3)
    assert plan is not None and plan.step == 40 and set(plan.sources) == {0, 1, 2}


def test_snapshots_of_two_attempts_are_never_combined() -> None:
    # Attempt 1's rank 0 state and attempt 2's rank 1 state are both of step 40, but of two different runs.
    offers = [[offer(40, (0,), attempt=1)], [offer(40, (1,), attempt=2)]]
    assert choose(0, offers, 2) is None

    offers[1].append(offer(40, (0, 1), attempt=2))  # attempt 2's survivor holds both of its ranks' states
    plan = choose(0, offers, 2)
    assert plan is not None and plan.attempt == 2 and plan.sources[0][0] == 1


def _cfg(tmp_path: Path, **overrides: str) -> RunConfig:
    env = {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "SHARDYARD_MODEL_DIR": "/m",
        "SHARDYARD_DATASET_DIR": "/d",
        "SHARDYARD_OUTPUT_DIR": "/o",
        "SHARDYARD_SYNC_INTERVAL": "10",
        "SHARDYARD_MAX_STEPS": "100",
        "SHARDYARD_BATCH_SIZE": "4",
        "SHARDYARD_SEQ_LEN": "16",
        "SHARDYARD_LR": "0.001",
        "SHARDYARD_SEED": "3",
        "SHARDYARD_PEER_STATE_DIR": str(tmp_path),
        "SHARDYARD_ATTEMPT": "2",
        **overrides,
    }
    return RunConfig.from_env(env)


def _snapshot(root: Path, name: str, **state: object) -> None:
    document = {"world_size": 2, "sync_interval": 10, "seed": 3, "step": 40, "attempt": 1, "ranks": [0, 1]}
    (root / name).mkdir(parents=True)
    (root / name / "state.json").write_text(json.dumps({**document, **state}))


@pytest.mark.parametrize(
    ("state", "kept"),
    [
        ({}, True),
        ({"world_size": 4}, False),
        ({"sync_interval": 20}, False),
        ({"seed": 4}, False),
        ({"step": 101}, False),  # past max_steps
        ({"step": 0}, False),
        ({"ranks": "all"}, False),
    ],
)
def test_only_snapshots_of_this_run_are_offered(tmp_path: Path, state: dict[str, object], kept: bool) -> None:
    _snapshot(tmp_path, "rank-0", **state)
    cfg = _cfg(tmp_path)
    assert cfg.peer_state_dir == tmp_path and cfg.attempt == 2

    offers = read_offers(cfg.peer_state_dir, cfg)

    assert offers == ([Offer(step=40, attempt=1, ranks=(0, 1), directory=str(tmp_path / "rank-0"))] if kept else [])


def test_unreadable_snapshots_and_other_files_are_left_out(tmp_path: Path) -> None:
    (tmp_path / "rank-0").mkdir()  # no state.json
    (tmp_path / "rank-1").mkdir()
    (tmp_path / "rank-1" / "state.json").write_text("{not json")
    (tmp_path / "rank-2.tmp-1").write_text("")
    _snapshot(tmp_path, "other")
    assert read_offers(tmp_path, _cfg(tmp_path)) == []
    assert read_offers(tmp_path / "absent", _cfg(tmp_path)) == []
    assert read_offers(None, _cfg(tmp_path)) == []
