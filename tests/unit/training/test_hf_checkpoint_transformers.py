"""Hugging Face checkpoints both ways, against ``transformers`` itself: what it saves loads here with the same logits,
what Shardyard saves (a model, a training checkpoint, the fine-tune runner's output) loads there with the same logits.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel

from shardyard.training import exitcodes
from shardyard.training.artifacts import create_demo_artifacts
from shardyard.training.checkpoint import TrainingState, optimizer_bytes, save_checkpoint
from shardyard.training.data import ByteDataset
from shardyard.training.model import WEIGHTS_INDEX_FILE, TinyGPT, TinyGPTConfig, load_pretrained, save_pretrained
from shardyard.training.preemption import StopFlag
from shardyard.training.runner import main

SMALL: dict[str, Any] = {"vocab_size": 256, "n_positions": 64, "n_embd": 32, "n_layer": 2, "n_head": 4}
ATOL = 1e-5


def _hf_model(seed: int = 0, **config: Any) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(**{**SMALL, **config})).eval()


def _hf_load(directory: Path) -> GPT2LMHeadModel:
    model = GPT2LMHeadModel.from_pretrained(directory, local_files_only=True, dtype=torch.float32)
    return model.eval()


def _bytes(seed: int = 1, shape: tuple[int, int] = (3, 40)) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(seed))


def _same_logits(ours: TinyGPT, theirs: GPT2LMHeadModel) -> None:
    idx = _bytes()
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(idx), theirs.eval()(idx).logits, atol=ATOL, rtol=0)


VARIANTS = [
    pytest.param({}, {}, id="gpt2"),
    pytest.param(
        {
            "tie_word_embeddings": False,
            "n_inner": 48,
            "activation_function": "gelu",
            "layer_norm_epsilon": 1e-3,
            "scale_attn_by_inverse_layer_idx": True,
        },
        {},
        id="untied-n_inner-gelu-eps-inverse-layer-scale",
    ),
    pytest.param({"activation_function": "relu", "scale_attn_weights": False}, {}, id="relu-unscaled"),
    pytest.param({}, {"max_shard_size": "20KB"}, id="sharded"),
]


@pytest.mark.parametrize(("config", "save"), VARIANTS)
def test_a_checkpoint_transformers_saved_loads_with_the_same_logits(
    tmp_path: Path, config: dict[str, Any], save: dict[str, Any]
) -> None:
    theirs = _hf_model(**config)
    theirs.save_pretrained(tmp_path / "hf", **save)

    ours = load_pretrained(tmp_path / "hf")

    assert (tmp_path / "hf" / WEIGHTS_INDEX_FILE).is_file() == ("max_shard_size" in save)
    assert ours.weights_tied == theirs.config.tie_word_embeddings
    _same_logits(ours, theirs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_checkpoints_load_as_transformers_loads_them(tmp_path: Path, dtype: torch.dtype) -> None:
    _hf_model().to(dtype).save_pretrained(tmp_path / "hf")

    _same_logits(load_pretrained(tmp_path / "hf"), _hf_load(tmp_path / "hf"))


def test_a_base_gpt2_model_checkpoint_loads_as_its_lm_head_model(tmp_path: Path) -> None:
    """GPT2Model's names (no ``transformer.`` prefix), as the hub's gpt2 stores them: the head is the embedding."""
    _hf_model().transformer.save_pretrained(tmp_path / "base")

    _same_logits(load_pretrained(tmp_path / "base"), _hf_load(tmp_path / "base"))


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_what_shardyard_saves_transformers_loads_with_the_same_logits(tmp_path: Path, tied: bool) -> None:
    torch.manual_seed(0)
    ours = TinyGPT(TinyGPTConfig(n_positions=64, n_embd=32, n_layer=2, n_head=4, tie_word_embeddings=tied))
    optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    for _ in range(3):  # trained a little: the tied head moved with the embedding
        loss = ours(_bytes(2, (2, 16))).logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    theirs = _hf_load(save_pretrained(ours, tmp_path / "ours"))

    assert theirs.config.tie_word_embeddings is tied
    _same_logits(ours, theirs)


def test_a_training_checkpoint_loads_with_transformers(tmp_path: Path) -> None:
    ours = load_pretrained(create_demo_artifacts(tmp_path / "data", text_bytes=1000).model_dir)
    optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    state = TrainingState(step=10, loss=3.0, world_size=2, seed=0, sync_interval=5)

    ranks = {1: optimizer_bytes(optimizer)}  # every file of a gang's checkpoint beside the model's

    checkpoint = save_checkpoint(tmp_path / "checkpoint", ours, optimizer, state, ranks)

    _same_logits(ours, _hf_load(checkpoint))


def test_the_demo_model_is_a_byte_level_gpt2_for_transformers(tmp_path: Path) -> None:
    model_dir = create_demo_artifacts(tmp_path, text_bytes=1000).model_dir

    theirs = _hf_load(model_dir)

    assert type(theirs.config) is GPT2Config and theirs.config.vocab_size == 256
    assert theirs.config.bos_token_id is None and theirs.config.eos_token_id is None
    _same_logits(load_pretrained(model_dir), theirs)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _loss(model: GPT2LMHeadModel, dataset: ByteDataset) -> float:
    inputs, targets = next(dataset.batches(0, 1, 16, 32, seed=99))
    with torch.no_grad():
        logits = model(inputs).logits
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1)))


def test_the_fine_tune_runner_round_trips_a_transformers_checkpoint(tmp_path: Path) -> None:
    """The acceptance: load a checkpoint transformers made, train, save; transformers reloads what was saved."""
    pretrained = tmp_path / "pretrained"
    _hf_model(seed=3).save_pretrained(pretrained)  # dropout 0.1 (GPT2Config's default), as transformers made it
    dataset_dir = create_demo_artifacts(tmp_path / "data", text_bytes=40_000).dataset_dir
    output = tmp_path / "out"
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_port()),
        "SHARDYARD_MODEL_DIR": str(pretrained),
        "SHARDYARD_DATASET_DIR": str(dataset_dir),
        "SHARDYARD_OUTPUT_DIR": str(output),
        "SHARDYARD_SYNC_INTERVAL": "10",
        "SHARDYARD_MAX_STEPS": "40",
        "SHARDYARD_BATCH_SIZE": "8",
        "SHARDYARD_SEQ_LEN": "32",
        "SHARDYARD_LR": "3e-3",
        "SHARDYARD_SEED": "0",
    }

    assert main(env, StopFlag()) == exitcodes.OK

    before, after = _hf_load(pretrained), _hf_load(output)
    saved = load_file(str(output / "model.safetensors"))
    reloaded = after.state_dict()
    assert saved.keys() <= reloaded.keys() and "lm_head.weight" not in saved
    for name, tensor in saved.items():
        assert torch.equal(reloaded[name], tensor), name  # transformers holds exactly what the runner saved
    assert torch.equal(reloaded["lm_head.weight"], saved["transformer.wte.weight"])  # tied, as it was
    assert not torch.equal(reloaded["transformer.wte.weight"], before.state_dict()["transformer.wte.weight"])
    assert after.config.attn_pdrop == before.config.attn_pdrop == 0.1
    dataset = ByteDataset.from_dir(dataset_dir)
    assert _loss(after, dataset) < _loss(before, dataset) - 0.5  # it learned the text
    _same_logits(load_pretrained(output / "checkpoint"), _hf_load(output / "checkpoint"))  # the last checkpoint
