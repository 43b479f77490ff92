from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from shardyard.training import model as model_mod
from shardyard.training.model import (
    CONFIG_FILE,
    MODEL_TYPE,
    WEIGHTS_FILE,
    CheckpointError,
    TinyGPT,
    TinyGPTConfig,
    load_pretrained,
    save_pretrained,
)

SMALL = TinyGPTConfig(n_positions=32, n_embd=16, n_layer=2, n_head=2)


def _model(seed: int, config: TinyGPTConfig = SMALL) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(config)


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_default_config_matches_the_spec() -> None:
    assert TinyGPTConfig() == TinyGPTConfig(vocab_size=256, n_positions=128, n_embd=64, n_layer=2, n_head=4)


@pytest.mark.parametrize("kwargs", [{"n_embd": 10, "n_head": 4}, {"n_layer": 0}, {"vocab_size": -1}])
def test_bad_config_is_rejected(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        TinyGPTConfig(**kwargs)


def test_forward_shape_and_causality() -> None:
    model = _model(0).eval()
    idx = torch.randint(0, 256, (3, 20))
    logits = model(idx)
    assert logits.shape == (3, 20, 256)
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 256  # the future must not affect earlier positions
    with torch.no_grad():
        torch.testing.assert_close(model(changed)[:, :10], logits[:, :10].detach())
    with pytest.raises(ValueError, match="n_positions"):
        model(torch.zeros(1, SMALL.n_positions + 1, dtype=torch.long))


def test_round_trip_gives_identical_logits_and_tied_weights(tmp_path: Path) -> None:
    model = _model(1).eval()
    target = save_pretrained(model, tmp_path / "ckpt")
    assert json.loads((target / CONFIG_FILE).read_text())["model_type"] == MODEL_TYPE
    assert "lm_head.weight" not in load_file(str(target / WEIGHTS_FILE))  # one copy of the tied tensor

    loaded = load_pretrained(target)
    assert loaded.config == SMALL
    assert loaded.weights_tied and loaded.lm_head.weight is loaded.transformer.wte.weight
    idx = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert torch.equal(loaded(idx), model(idx))
    with torch.no_grad():  # still tied after load: changing the embedding changes the head
        loaded.transformer.wte.weight[0, 0] += 1.0
    assert loaded.lm_head.weight[0, 0] == loaded.transformer.wte.weight[0, 0]


def test_save_replaces_an_existing_directory_atomically(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    save_pretrained(_model(1), target)
    (target / "stale.txt").write_text("left over from an older checkpoint")
    second = _model(2)
    save_pretrained(second, target)
    assert not (target / "stale.txt").exists()
    assert torch.equal(load_pretrained(target).transformer.wte.weight, second.transformer.wte.weight)
    assert _leftovers(tmp_path) == []


def test_failed_save_leaves_the_old_checkpoint_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "ckpt"
    first = _model(1)
    save_pretrained(first, target)

    def boom(*args: object, **kwargs: object) -> bytes:
        raise OSError("disk full")

    monkeypatch.setattr(model_mod, "tensor_bytes", boom)
    with pytest.raises(OSError, match="disk full"):
        save_pretrained(_model(2), target)
    assert torch.equal(load_pretrained(target).transformer.wte.weight, first.transformer.wte.weight)
    assert _leftovers(tmp_path) == []


def test_save_creates_missing_parents(tmp_path: Path) -> None:
    target = save_pretrained(_model(0), tmp_path / "a" / "b" / "ckpt")
    assert load_pretrained(target).config == SMALL


def _corrupt(path: Path, how: str) -> None:
    if how == "no-config":
        (path / CONFIG_FILE).unlink()
    elif how == "no-weights":
        (path / WEIGHTS_FILE).unlink()
    elif how == "bad-json":
        (path / CONFIG_FILE).write_text("{not json")
    elif how == "wrong-model-type":
        (path / CONFIG_FILE).write_text(json.dumps({"model_type": "llama"}))
    elif how == "garbage-weights":
        (path / WEIGHTS_FILE).write_bytes(b"\x00" * 64)
    elif how in ("missing-tensor", "wrong-shape"):
        state = load_file(str(path / WEIGHTS_FILE))
        if how == "missing-tensor":
            del state["transformer.ln_f.weight"]
        else:
            state["transformer.ln_f.weight"] = torch.zeros(3)
        save_file(state, str(path / WEIGHTS_FILE))


@pytest.mark.parametrize(
    "how",
    ["no-config", "no-weights", "bad-json", "wrong-model-type", "garbage-weights", "missing-tensor", "wrong-shape"],
)
def test_invalid_checkpoint_raises_checkpoint_error(tmp_path: Path, how: str) -> None:
    target = save_pretrained(_model(0), tmp_path / "ckpt")
    _corrupt(target, how)
    with pytest.raises(CheckpointError):
        load_pretrained(target)


def test_missing_directory_raises_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_pretrained(tmp_path / "nope")


def test_replacing_swaps_in_one_exchange_where_the_system_has_it(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "which").write_text("a")
    (b / "which").write_text("b")
    if not model_mod._exchange(a, b):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here")
    assert ((a / "which").read_text(), (b / "which").read_text()) == ("b", "a")


def test_without_the_exchange_replacing_takes_two_renames(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_mod, "_exchange", lambda a, b: False)
    target = tmp_path / "ckpt"
    save_pretrained(_model(1), target)
    second = _model(2)

    save_pretrained(second, target)

    assert torch.equal(load_pretrained(target).transformer.wte.weight, second.transformer.wte.weight)
    assert _leftovers(tmp_path) == []
