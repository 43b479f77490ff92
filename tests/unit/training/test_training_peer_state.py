"""Which state a re-formed gang resumes from: its survivors' snapshots or the checkpoint (pure logic, no gang)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from shardyard.training.checkpoint import TrainingState, checkpoint_files, load_checkpoint, optimizer_bytes
from shardyard.training.config import RunConfig
from shardyard.training.model import TinyGPT, TinyGPTConfig
from shardyard.training.peer_resume import (
    Offer,
    ResumePlan,
    _files_for,
    agree_on_resume,
    choose,
    read_offers,
    transfer,
)
from shardyard.training.peer_state import PeerSnapshots


def offer(step: int, ranks: tuple[int, ...], *, attempt: int = 1, where: str = "", world: int = 2) -> Offer:
    """A snapshot of a gang of ``world`` ranks holding ``ranks``' optimizer state."""
    directory = where or f"/n/rank-{ranks[0]}"
    return Offer(step=step, attempt=attempt, ranks=ranks, world_size=world, directory=directory)


def test_the_newest_step_that_holds_every_rank_wins_over_an_older_checkpoint() -> None:
    # Rank 1 was lost and came back on a new node: rank 0's snapshot holds both states, rank 2's its own and 1's.
    offers = [[offer(40, (0, 2), where="/a/rank-0", world=3)], [], [offer(40, (1, 2), where="/c/rank-2", world=3)]]

    plan = choose(20, offers, 3)

    sources = {0: (0, "/a/rank-0"), 1: (2, "/c/rank-2"), 2: (2, "/c/rank-2")}
    assert plan == ResumePlan(step=40, attempt=1, world_size=3, sources=sources)


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
    offers = [[], [], [offer(60, (1, 2), world=3), offer(40, (0, 1), where="/c/old", world=3)]]
    assert choose(0, offers, 3) is None  # step 40 lacks rank 2's state too

    offers = [[offer(40, (0, 1, 2), where="/a/old", world=3)], [], [offer(60, (1, 2), world=3)]]
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
        ({"world_size": 4}, True),  # an elastic gang re-formed at another world size
        ({"world_size": 1, "ranks": [0]}, True),
        ({"world_size": 1}, False),  # a rank the gang did not have
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

    raw = json.loads((tmp_path / "rank-0" / "state.json").read_text())
    world, ranks = raw["world_size"], tuple(raw["ranks"])
    expected = Offer(step=40, attempt=1, ranks=ranks, world_size=world, directory=str(tmp_path / "rank-0"))
    assert offers == ([expected] if kept else [])


def test_unreadable_snapshots_and_other_files_are_left_out(tmp_path: Path) -> None:
    (tmp_path / "rank-0").mkdir()  # no state.json
    (tmp_path / "rank-1").mkdir()
    (tmp_path / "rank-1" / "state.json").write_text("{not json")
    (tmp_path / "rank-2.tmp-1").write_text("")
    _snapshot(tmp_path, "other")
    assert read_offers(tmp_path, _cfg(tmp_path)) == []
    assert read_offers(tmp_path / "absent", _cfg(tmp_path)) == []
    assert read_offers(None, _cfg(tmp_path)) == []


def ring(world: int, node_of: dict[int, int], new_world: int, step: int = 50) -> list[list[Offer]]:
    """Local SGD snapshots of a gang of ``world`` (rank ``r`` holds ``r`` and ``r - 1``), on the nodes of the new
    gang's ranks (``node_of``: old rank -> the new rank on its node; an old rank not in it was lost)."""
    offers: list[list[Offer]] = [[] for _ in range(new_world)]
    for old, new in node_of.items():
        held = (old, (old - 1) % world)
        offers[new].append(offer(step, held, where=f"/node-{new}/rank-{old}", world=world))
    return offers


def test_a_gang_grown_from_2_to_4_takes_the_optimizer_states_of_old_ranks_0_1_0_1() -> None:
    offers = ring(2, {0: 0, 1: 1}, 4)  # new ranks 2 and 3 are on new nodes, without snapshots

    plan = choose(0, offers, 4)

    assert plan is not None and (plan.step, plan.world_size) == (50, 2)
    assert [plan.old_rank(rank) for rank in range(4)] == [0, 1, 0, 1]
    assert plan.sources == {
        0: (0, "/node-0/rank-0"),
        1: (1, "/node-1/rank-1"),
        2: (0, "/node-0/rank-0"),
        3: (0, "/node-0/rank-0"),
    }


def test_a_gang_shrunk_from_4_to_2_takes_old_ranks_0_and_1_from_its_own_nodes_where_it_can() -> None:
    offers = ring(4, {0: 0, 2: 0, 1: 1, 3: 1}, 2)
    plan = choose(0, offers, 2)
    assert plan is not None and plan.world_size == 4
    assert plan.sources == {0: (0, "/node-0/rank-0"), 1: (1, "/node-1/rank-1")}

    offers = ring(4, {0: 0, 2: 0}, 2)  # old ranks 1 and 3 were on a node that left: rank 2's snapshot holds 1's
    plan = choose(0, offers, 2)
    assert plan is not None and plan.sources == {0: (0, "/node-0/rank-0"), 1: (0, "/node-0/rank-2")}


def test_a_resized_gang_falls_back_to_the_checkpoint_when_an_old_rank_it_needs_is_missing() -> None:
    assert choose(0, ring(4, {2: 0, 3: 1}, 2), 2) is None  # old rank 0's state was held by ranks 0 and 1 only
    assert choose(0, ring(4, {2: 0, 3: 1}, 4), 4) is None


@pytest.mark.parametrize(("old", "new"), [(2, 4), (4, 2), (1, 2), (2, 1)])
def test_with_gradient_averaging_any_snapshot_serves_every_new_rank(old: int, new: int) -> None:
    every = tuple(range(old))
    offers: list[list[Offer]] = [[] for _ in range(new)]
    offers[new - 1].append(offer(70, every, where="/last/rank-0", world=old))

    plan = choose(10, offers, new)

    assert plan is not None and plan.world_size == old
    assert plan.sources == dict.fromkeys(range(new), (new - 1, "/last/rank-0"))


def test_snapshots_of_one_step_from_gangs_of_two_sizes_are_never_combined() -> None:
    offers = [[offer(40, (0,), world=4)], [offer(40, (1,), world=2)]]  # two gangs' partial states at step 40
    assert choose(0, offers, 2) is None


def test_a_gang_of_one_resumes_from_its_own_nodes_snapshot_when_it_is_newer(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, RANK="0", WORLD_SIZE="1")
    offers = [offer(40, (0, 1), where="/a/rank-1", world=2)]

    plan = agree_on_resume(cfg, 20, offers)  # no process group needed: nobody else to hear from

    assert plan == ResumePlan(step=40, attempt=1, world_size=2, sources={0: (0, "/a/rank-1")})
    assert agree_on_resume(cfg, 40, offers) is None
    assert agree_on_resume(cfg, 20, []) is None


SMALL = TinyGPTConfig(n_positions=16, n_embd=16, n_layer=1, n_head=2)


def _trained(moment: float) -> tuple[TinyGPT, torch.optim.Optimizer]:
    """A model and an optimizer whose first moments are all ``moment``."""
    torch.manual_seed(0)
    model = TinyGPT(SMALL).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(0, 256, (2, 8))).mean().backward()
    optimizer.step()
    for state in optimizer.state.values():
        state["exp_avg"].fill_(moment)
    return model, optimizer


def _first_moment(optimizer: dict[str, Any] | None) -> float:
    assert optimizer is not None
    return float(next(iter(optimizer["state"].values()))["exp_avg"].flatten()[0])


def test_a_single_shard_keeps_its_state_and_resumes_from_it_or_grows_to_two_from_it(tmp_path: Path) -> None:
    """Local SGD at world 1: the shard keeps its state (no ring). Alone again, it resumes from it on its node; grown
    to a gang of 2, rank 0 loads it there and rank 1 gets the files rank 0 sends it, under its own name."""
    model, optimizer = _trained(0.5)
    alone = _cfg(tmp_path, RANK="0", WORLD_SIZE="1")
    single = PeerSnapshots(alone, None, torch.device("cpu"))
    assert single.enabled
    single.synced(30, 1.5, model, optimizer)
    kept = single.save(model, optimizer)
    assert kept == tmp_path / "rank-0"

    again = agree_on_resume(alone, 20, read_offers(alone.peer_state_dir, alone))
    assert again is not None
    mine = transfer(alone, again)  # a gang of one: from its own node, no process group
    assert (mine.state.step, _first_moment(mine.optimizer)) == (30, 0.5)

    grown = _cfg(tmp_path, RANK="0", WORLD_SIZE="2")
    plan = choose(0, [read_offers(grown.peer_state_dir, grown), []], 2)
    assert plan is not None and plan.world_size == 1 and plan.sources == {0: (0, str(kept)), 1: (0, str(kept))}
    sent = tmp_path / "sent"
    sent.mkdir()
    for name, data in _files_for(kept, plan.old_rank(1), 1).items():
        (sent / name).write_bytes(data)
    theirs = load_checkpoint(sent, rank=1)
    assert (theirs.state.step, _first_moment(theirs.optimizer)) == (30, 0.5)


def test_a_grown_rank_gets_the_optimizer_state_of_the_old_rank_it_maps_to(tmp_path: Path) -> None:
    snapshot = tmp_path / "rank-1"  # a local SGD snapshot of old rank 1 of 2: its state and rank 0's
    model, optimizer = _trained(1.0)
    _, rank0 = _trained(0.0)
    files = checkpoint_files(model, rank0, TrainingState(40, 2.0, 2, 3, 10), {1: optimizer_bytes(optimizer)})
    snapshot.mkdir()
    for name, data in files.items():
        (snapshot / name).write_bytes(data)

    for new_rank, old_rank in [(2, 0), (3, 1), (1, 1)]:
        target = tmp_path / f"new-{new_rank}"
        target.mkdir()
        for name, data in _files_for(snapshot, old_rank, new_rank).items():
            (target / name).write_bytes(data)
        assert _first_moment(load_checkpoint(target, rank=new_rank).optimizer) == float(old_rank)
