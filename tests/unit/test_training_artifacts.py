from __future__ import annotations

from pathlib import Path

from shardyard.training.artifacts import create_demo_artifacts, generate_text
from shardyard.training.data import ByteDataset
from shardyard.training.model import TinyGPTConfig, load_pretrained


def test_creates_a_loadable_model_and_a_text_dataset(tmp_path: Path) -> None:
    art = create_demo_artifacts(tmp_path, seed=3)
    assert art.model_dir == tmp_path / "models" / "gpt2_pretrained"
    assert art.dataset_dir == tmp_path / "datasets" / "wikitext"
    assert load_pretrained(art.model_dir).config == TinyGPTConfig()
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


def test_generate_text_is_seeded() -> None:
    assert generate_text(0, 5000) == generate_text(0, 5000)
    assert generate_text(0, 5000) != generate_text(1, 5000)
    assert len(generate_text(2, 1234)) == 1234
