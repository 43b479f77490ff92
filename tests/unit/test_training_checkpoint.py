from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from shardyard.training.checkpoint import (
    OPTIMIZER_FILE,
    STATE_FILE,
    TrainingState,
    load_checkpoint,
    save_checkpoint,
)
from shardyard.training.model import CONFIG_FILE, WEIGHTS_FILE, CheckpointError, TinyGPT, TinyGPTConfig, save_pretrained

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
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoint"]  # no temp leftovers


def test_a_newer_checkpoint_replaces_the_older(tmp_path: Path) -> None:
    model, optimizer = _trained()
    save_checkpoint(tmp_path / "ckpt", model, optimizer, STATE)

    save_checkpoint(tmp_path / "ckpt", model, optimizer, TrainingState(80, None, 2, 7, 10))

    assert load_checkpoint(tmp_path / "ckpt").state.step == 80


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
