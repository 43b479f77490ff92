from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from shardyard.training import checkpoint as checkpoint_mod
from shardyard.training.checkpoint import (
    LEGACY_OPTIMIZER_FILE,
    OPTIMIZER_FILE,
    STATE_FILE,
    Checkpoint,
    CheckpointWriter,
    TrainingState,
    checkpoint_files,
    load_checkpoint,
    optimizer_bytes,
    rank_optimizer_file,
    save_checkpoint,
    write_if_newer,
)
from shardyard.training.gpt2 import CONV1D_WEIGHTS
from shardyard.training.model import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    TinyGPT,
    TinyGPTConfig,
    recover_leftovers,
    save_pretrained,
)

SMALL = TinyGPTConfig(n_positions=16, n_embd=16, n_layer=1, n_head=2)
STATE = TrainingState(step=40, loss=3.25, world_size=2, seed=7, sync_interval=10)


def _trained() -> tuple[TinyGPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = TinyGPT(SMALL).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        loss = model(torch.randint(0, 256, (2, 8))).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, optimizer


def test_round_trip(tmp_path: Path) -> None:
    model, optimizer = _trained()

    target = save_checkpoint(tmp_path / "out" / "checkpoint", model, optimizer, STATE)
    loaded = load_checkpoint(target)

    assert sorted(p.name for p in target.iterdir()) == [CONFIG_FILE, WEIGHTS_FILE, OPTIMIZER_FILE, STATE_FILE]
    assert loaded.state == STATE
    for key, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.model.state_dict()[key], tensor)
    assert loaded.model.weights_tied
    fresh = torch.optim.AdamW(loaded.model.parameters(), lr=1e-2)
    assert loaded.optimizer is not None
    fresh.load_state_dict(loaded.optimizer)
    for saved, restored in zip(optimizer.state.values(), fresh.state.values(), strict=True):
        torch.testing.assert_close(restored["exp_avg"], saved["exp_avg"])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".checkpoint.lock", "checkpoint"]  # no temp


def test_each_rank_resumes_with_its_own_optimizer_state(tmp_path: Path) -> None:
    model, optimizer = _trained()
    _other_model, other = _trained()
    for state in other.state.values():
        state["exp_avg"].add_(1.0)  # rank 1's moments differ from rank 0's (local SGD)

    target = save_checkpoint(tmp_path / "checkpoint", model, optimizer, STATE, {1: optimizer_bytes(other)})
    rank0, rank1 = (load_checkpoint(target, rank=r) for r in (0, 1))

    assert (target / rank_optimizer_file(1)).is_file()
    torch.testing.assert_close(_first_moment(rank1), next(iter(other.state.values()))["exp_avg"])
    torch.testing.assert_close(_first_moment(rank0), next(iter(optimizer.state.values()))["exp_avg"])


def _first_moment(checkpoint: Checkpoint) -> torch.Tensor:
    assert checkpoint.optimizer is not None
    moment: torch.Tensor = next(iter(checkpoint.optimizer["state"].values()))["exp_avg"]
    return moment


def _moments_by_rank(world_size: int) -> tuple[TinyGPT, torch.optim.Optimizer, dict[int, bytes]]:
    """A model, rank 0's optimizer and every other rank's state, rank ``r``'s first moments all ``r``."""
    model, optimizer = _trained()
    ranks = {}
    for rank in range(world_size):
        for state in optimizer.state.values():
            state["exp_avg"].fill_(rank)
        ranks[rank] = optimizer_bytes(optimizer)
    for state in optimizer.state.values():
        state["exp_avg"].fill_(0)
    return model, optimizer, ranks


@pytest.mark.parametrize(
    ("saved_world", "rank", "takes"),
    [(2, 0, 0), (2, 1, 1), (2, 2, 0), (2, 3, 1), (2, 5, 1), (4, 1, 1), (1, 1, 0), (3, 4, 1)],
    ids=lambda v: str(v),
)
def test_a_gang_of_another_world_size_resumes_rank_r_with_rank_r_mod_saved_worlds_optimizer_state(
    tmp_path: Path, saved_world: int, rank: int, takes: int
) -> None:
    """Local SGD, an elastic gang resumed at another size: new rank ``r`` continues with the moments of rank
    ``r mod W`` of the gang of ``W`` that checkpointed (grow 2 -> 4: 0, 1, 0, 1; shrink 4 -> 2: 0, 1)."""
    model, optimizer, ranks = _moments_by_rank(saved_world)
    state = TrainingState(step=40, loss=3.25, world_size=saved_world, seed=7, sync_interval=10)
    target = save_checkpoint(tmp_path / "checkpoint", model, optimizer, state, ranks)

    loaded = load_checkpoint(target, rank=rank)

    assert bool((_first_moment(loaded) == takes).all())


def test_a_shared_optimizer_file_serves_every_rank_at_any_world_size(tmp_path: Path) -> None:
    model, optimizer = _trained()  # gradient averaging at world 2: one optimizer state, rank 0's file only
    target = save_checkpoint(tmp_path / "checkpoint", model, optimizer, STATE)
    expected = next(iter(optimizer.state.values()))["exp_avg"]
    for rank in range(4):
        torch.testing.assert_close(_first_moment(load_checkpoint(target, rank=rank)), expected)


def test_a_rank_optimizer_file_of_its_own_wins_over_the_mapped_one(tmp_path: Path) -> None:
    """A state a peer sent (:func:`shardyard.training.peer_state.transfer`) is stored under the new rank's name in a
    directory whose ``state.json`` names the old world size: that file is the one read."""
    model, optimizer, ranks = _moments_by_rank(2)
    files = checkpoint_files(model, optimizer, STATE, {1: ranks[1]})
    files[rank_optimizer_file(3)] = ranks[0]  # new rank 3 of a grown gang, sent old rank 0's state on purpose
    (tmp_path / "sent").mkdir()
    for name, data in files.items():
        (tmp_path / "sent" / name).write_bytes(data)

    assert bool((_first_moment(load_checkpoint(tmp_path / "sent", rank=3)) == 0).all())


def test_a_newer_checkpoint_replaces_the_older(tmp_path: Path) -> None:
    model, optimizer = _trained()
    save_checkpoint(tmp_path / "ckpt", model, optimizer, STATE)

    save_checkpoint(tmp_path / "ckpt", model, optimizer, TrainingState(80, None, 2, 7, 10))

    assert load_checkpoint(tmp_path / "ckpt").state.step == 80


def test_a_rescue_never_replaces_a_later_checkpoint(tmp_path: Path) -> None:
    model, optimizer = _trained()
    files = lambda step: checkpoint_files(model, optimizer, TrainingState(step, 1.0, 2, 7, 10))  # noqa: E731

    assert write_if_newer(tmp_path / "ckpt", files(35), 35)  # nothing there yet
    assert not write_if_newer(tmp_path / "ckpt", files(30), 30)  # older: the periodic one that landed late
    assert not write_if_newer(tmp_path / "ckpt", files(35), 35)  # the same step from another survivor
    assert load_checkpoint(tmp_path / "ckpt").state.step == 35
    assert write_if_newer(tmp_path / "ckpt", files(40), 40)
    assert load_checkpoint(tmp_path / "ckpt").state.step == 40


def test_the_writer_skips_a_checkpoint_older_than_the_one_in_place(tmp_path: Path) -> None:
    model, optimizer = _trained()
    save_checkpoint(tmp_path / "ckpt", model, optimizer, TrainingState(35, 1.0, 2, 7, 10))  # a peer's rescue
    written: list[int] = []
    writer = CheckpointWriter(tmp_path / "ckpt", lambda step, d, ms: written.append(step))

    for step in (30, 40):
        writer.submit(step, checkpoint_files(model, optimizer, TrainingState(step, 1.0, 2, 7, 10)))
    writer.close()

    assert written == [40]
    assert load_checkpoint(tmp_path / "ckpt").state.step == 40


def test_a_non_finite_loss_is_stored_as_null(tmp_path: Path) -> None:
    model, optimizer = _trained()
    save_checkpoint(tmp_path / "ckpt", model, optimizer, TrainingState(10, math.nan, 1, 0, 10))

    assert json.loads((tmp_path / "ckpt" / STATE_FILE).read_text())["loss"] is None
    assert load_checkpoint(tmp_path / "ckpt").state.loss is None


def test_optimizer_state_is_optional(tmp_path: Path) -> None:
    model, optimizer = _trained()
    save_checkpoint(tmp_path / "ckpt", model, optimizer, STATE)
    (tmp_path / "ckpt" / OPTIMIZER_FILE).unlink()

    assert load_checkpoint(tmp_path / "ckpt").optimizer is None


@pytest.mark.parametrize(
    ("how", "message"),
    [
        pytest.param("pretrained-only", "not a training checkpoint", id="no-state"),
        pytest.param("bad-json", "cannot read", id="bad-json"),
        pytest.param("wrong-format", "format-1", id="wrong-format"),
        pytest.param("negative-step", "step", id="negative-step"),
        pytest.param("string-loss", "loss", id="string-loss"),
        pytest.param("bad-optimizer", "optimizer", id="bad-optimizer"),
    ],
)
def test_broken_checkpoints_raise_checkpoint_error(tmp_path: Path, how: str, message: str) -> None:
    model, optimizer = _trained()
    target = tmp_path / "ckpt"
    save_checkpoint(target, model, optimizer, STATE)
    state = json.loads((target / STATE_FILE).read_text())
    match how:
        case "pretrained-only":
            save_pretrained(model, target)
        case "bad-json":
            (target / STATE_FILE).write_text("{")
        case "wrong-format":
            (target / STATE_FILE).write_text(json.dumps({**state, "format": 99}))
        case "negative-step":
            (target / STATE_FILE).write_text(json.dumps({**state, "step": -1}))
        case "string-loss":
            (target / STATE_FILE).write_text(json.dumps({**state, "loss": "low"}))
        case "bad-optimizer":
            (target / OPTIMIZER_FILE).write_bytes(b"not a pickle")

    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(target)


@pytest.mark.parametrize("name", [CONFIG_FILE, WEIGHTS_FILE, "", "a/b", ".hidden"])
def test_extra_files_must_be_plain_free_names(tmp_path: Path, name: str) -> None:
    model, _ = _trained()

    with pytest.raises(ValueError, match="extra checkpoint file name"):
        save_pretrained(model, tmp_path / "ckpt", extra_files={name: b"x"})
    assert not (tmp_path / "ckpt").exists()


def test_a_legacy_optimizer_file_is_still_read(tmp_path: Path) -> None:
    model, optimizer = _trained()
    target = save_checkpoint(tmp_path / "ckpt", model, optimizer, STATE)
    (target / OPTIMIZER_FILE).unlink()
    torch.save(optimizer.state_dict(), target / LEGACY_OPTIMIZER_FILE)

    loaded = load_checkpoint(target)

    assert loaded.optimizer is not None
    torch.testing.assert_close(loaded.optimizer["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])


def test_the_writer_writes_in_order_in_the_background(tmp_path: Path) -> None:
    model, optimizer = _trained()
    written: list[tuple[int, Path, str]] = []
    writer = CheckpointWriter(
        tmp_path / "ckpt", lambda step, d, ms: written.append((step, d, threading.current_thread().name))
    )

    for step in (10, 20, 30):
        writer.submit(step, checkpoint_files(model, optimizer, TrainingState(step, 1.0, 2, 7, 10)))
    writer.close()

    assert [(step, d) for step, d, _ in written] == [
        (10, tmp_path / "ckpt"),
        (20, tmp_path / "ckpt"),
        (30, tmp_path / "ckpt"),
    ]
    assert all(name.startswith("checkpoint-writer") for _, _, name in written)
    assert load_checkpoint(tmp_path / "ckpt").state.step == 30
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ckpt.lock", "ckpt"]


def test_a_failed_write_keeps_the_previous_checkpoint_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model, optimizer = _trained()
    written: list[int] = []
    writer = CheckpointWriter(tmp_path / "ckpt", lambda step, d, ms: written.append(step))
    writer.submit(10, checkpoint_files(model, optimizer, TrainingState(10, 1.0, 2, 7, 10)))
    writer.wait()

    def refused(directory: object, files: object) -> Path:
        raise PermissionError(13, "Permission denied", str(directory))

    monkeypatch.setattr(checkpoint_mod, "write_dir_atomic", refused)
    writer.submit(20, checkpoint_files(model, optimizer, TrainingState(20, 1.0, 2, 7, 10)))
    writer.close()
    writer.check()  # not a full or failing disk: training goes on

    assert written == [10]
    assert "checkpoint of step 20 not written" in capsys.readouterr().err
    assert load_checkpoint(tmp_path / "ckpt").state.step == 10


def test_leftovers_of_a_writer_that_died_mid_write_are_tidied(tmp_path: Path) -> None:
    model, optimizer = _trained()
    save_checkpoint(tmp_path / "ckpt", model, optimizer, STATE)
    partial = tmp_path / ".ckpt.tmp-0123"  # killed while writing: a temp directory with part of the files
    partial.mkdir()
    (partial / CONFIG_FILE).write_text("{")

    CheckpointWriter(tmp_path / "ckpt", lambda step, d, ms: None).close()

    assert sorted(p.name for p in tmp_path.iterdir()) == [".ckpt.lock", "ckpt"]
    assert load_checkpoint(tmp_path / "ckpt").state == STATE


def test_a_death_between_the_fallback_renames_is_recovered(tmp_path: Path) -> None:
    """Without renameat2 the swap takes two renames; dying between them leaves only the old copy, put back."""
    model, optimizer = _trained()
    save_checkpoint(tmp_path / "ckpt", model, optimizer, STATE)
    (tmp_path / "ckpt").rename(tmp_path / ".ckpt.old-4567")

    recover_leftovers(tmp_path / "ckpt")

    assert sorted(p.name for p in tmp_path.iterdir()) == [".ckpt.lock", "ckpt"]
    assert load_checkpoint(tmp_path / "ckpt").state == STATE


def test_a_checkpoint_of_an_earlier_version_resumes_with_its_moments_transposed(tmp_path: Path) -> None:
    """Earlier versions stored the linear weights as nn.Linear ([out, in]); their optimizer moments were too."""
    model, optimizer = _trained()
    target = save_checkpoint(tmp_path / "ckpt", model, optimizer, STATE)
    names = [name for name, _ in model.named_parameters()]
    legacy = {
        key.removeprefix("transformer."): tensor.t() if key.endswith(CONV1D_WEIGHTS) else tensor
        for key, tensor in load_file(str(target / WEIGHTS_FILE)).items()
    }
    save_file({k: v.contiguous() for k, v in legacy.items()}, str(target / WEIGHTS_FILE), {"format": "pt"})
    fields = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
    config = {"model_type": "shardyard-tinygpt", **{name: getattr(SMALL, name) for name in fields}}
    (target / CONFIG_FILE).write_text(json.dumps(config))
    old = optimizer.state_dict()
    moments = {
        i: {k: v.t() if names[i].endswith(CONV1D_WEIGHTS) and k != "step" else v for k, v in entries.items()}
        for i, entries in old["state"].items()
    }
    (target / OPTIMIZER_FILE).write_bytes(checkpoint_mod._optimizer_bytes({**old, "state": moments}))

    loaded = load_checkpoint(target)

    for key, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.model.state_dict()[key], tensor, rtol=0, atol=0)
    fresh = torch.optim.AdamW(loaded.model.parameters(), lr=1e-2)
    assert loaded.optimizer is not None
    fresh.load_state_dict(loaded.optimizer)
    for saved, restored in zip(optimizer.state.values(), fresh.state.values(), strict=True):
        torch.testing.assert_close(restored["exp_avg"], saved["exp_avg"], rtol=0, atol=0)
        torch.testing.assert_close(restored["exp_avg_sq"], saved["exp_avg_sq"], rtol=0, atol=0)


def test_the_final_model_keeps_the_checkpoint_in_place_at_every_instant(tmp_path: Path) -> None:
    """A gang re-formed after its shard finished resumes from ``output/checkpoint``: the final model's save carries
    it over inside its one swap, never moving it out for a moment (a new attempt checked it in that moment and
    failed MISSING_ARTIFACT)."""
    from shardyard.training.steps import save_final

    model, optimizer = _trained()
    output = tmp_path / "out"
    save_checkpoint(output / "checkpoint", model, optimizer, STATE)
    before = {p.name: p.read_bytes() for p in (output / "checkpoint").iterdir()}
    missing: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if not (output / "checkpoint" / STATE_FILE).is_file():
                missing.append(1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(20):
            save_final(model, output)
    finally:
        done.set()
        watcher.join()

    assert not missing, f"the checkpoint was missing at {len(missing)} looks"
    assert {p.name: p.read_bytes() for p in (output / "checkpoint").iterdir()} == before
    assert (output / WEIGHTS_FILE).is_file() and (output / CONFIG_FILE).is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing parked beside it
