from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file, save_file

from shardyard.training.artifacts import create_demo_artifacts, generate_text
from shardyard.training.data import ByteDataset
from shardyard.training.gpt2 import CONV1D_WEIGHTS
from shardyard.training.model import TinyGPTConfig, is_legacy_layout, load_pretrained


def test_creates_a_loadable_model_and_a_text_dataset(tmp_path: Path) -> None:
    art = create_demo_artifacts(tmp_path, seed=3)
    assert art.model_dir == tmp_path / "models" / "gpt2_pretrained"
    assert art.dataset_dir == tmp_path / "datasets" / "wikitext"
    assert load_pretrained(art.model_dir).config == TinyGPTConfig()
    config = json.loads((art.model_dir / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"], config["n_positions"]) == ("gpt2", 256, 128)  # byte-level
    text = (art.dataset_dir / "train.txt").read_text("ascii")
    assert 200_000 <= len(text) <= 1_000_000
    assert " = " in text and " ." in text
    assert len(ByteDataset.from_dir(art.dataset_dir)) == len(text)


def test_is_deterministic_and_idempotent(tmp_path: Path) -> None:
    a = create_demo_artifacts(tmp_path / "a", seed=1)
    b = create_demo_artifacts(tmp_path / "b", seed=1)
    for name in ("model.safetensors", "config.json"):
        assert (a.model_dir / name).read_bytes() == (b.model_dir / name).read_bytes()
    assert (a.dataset_dir / "train.txt").read_bytes() == (b.dataset_dir / "train.txt").read_bytes()
    mtime = (a.model_dir / "model.safetensors").stat().st_mtime_ns
    create_demo_artifacts(tmp_path / "a", seed=1)  # exists and loads: kept
    assert (a.model_dir / "model.safetensors").stat().st_mtime_ns == mtime


def test_model_config_can_be_chosen(tmp_path: Path) -> None:
    small = TinyGPTConfig(n_positions=64, n_embd=32, n_layer=1, n_head=2)
    create_demo_artifacts(tmp_path)
    art = create_demo_artifacts(tmp_path, model_config=small)  # different config: rewritten
    assert load_pretrained(art.model_dir).config == small


def test_a_model_an_earlier_version_wrote_is_replaced_by_a_gpt2_checkpoint(tmp_path: Path) -> None:
    art = create_demo_artifacts(tmp_path, seed=1)
    config = json.loads((art.model_dir / "config.json").read_text())
    weights = art.model_dir / "model.safetensors"
    legacy = {
        key.removeprefix("transformer."): tensor.t().contiguous() if key.endswith(CONV1D_WEIGHTS) else tensor
        for key, tensor in load_file(str(weights)).items()
    }
    save_file(legacy, str(weights), {"format": "pt"})
    (art.model_dir / "config.json").write_text(json.dumps({**config, "model_type": "shardyard-tinygpt"}))
    assert is_legacy_layout(art.model_dir) and load_pretrained(art.model_dir).config == TinyGPTConfig()

    create_demo_artifacts(tmp_path, seed=1)

    assert not is_legacy_layout(art.model_dir)
    assert json.loads((art.model_dir / "config.json").read_text()) == config


def test_generate_text_is_seeded() -> None:
    assert generate_text(0, 5000) == generate_text(0, 5000)
    assert generate_text(0, 5000) != generate_text(1, 5000)
    assert len(generate_text(2, 1234)) == 1234
