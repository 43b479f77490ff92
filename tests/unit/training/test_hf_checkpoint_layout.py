"""The model directory is a Hugging Face GPT-2 checkpoint: what is written, and the variants of it that are read.
No ``transformers`` here; ``test_hf_checkpoint_transformers.py`` checks against it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from shardyard.training.gpt2 import CONV1D_WEIGHTS, HF_DEFAULTS
from shardyard.training.model import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    WEIGHTS_INDEX_FILE,
    CheckpointError,
    TinyGPT,
    TinyGPTConfig,
    is_legacy_layout,
    load_pretrained,
    save_pretrained,
)

SMALL = TinyGPTConfig(n_positions=32, n_embd=16, n_layer=2, n_head=2)


def _model(config: TinyGPTConfig = SMALL, seed: int = 0) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(config).eval()


def _logits(model: TinyGPT, seed: int = 1) -> torch.Tensor:
    idx = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(idx)


def _write(directory: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    directory.mkdir(parents=True)
    (directory / CONFIG_FILE).write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / WEIGHTS_FILE), {"format": "pt"})
    return directory


def test_the_directory_is_a_gpt2_lm_head_model(tmp_path: Path) -> None:
    target = save_pretrained(_model(), tmp_path / "ckpt")

    config = json.loads((target / CONFIG_FILE).read_text())
    tensors = load_file(str(target / WEIGHTS_FILE))

    assert config["model_type"] == "gpt2" and config["architectures"] == ["GPT2LMHeadModel"]
    assert {k: config[k] for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")} == {
        "vocab_size": 256,
        "n_positions": 32,
        "n_embd": 16,
        "n_layer": 2,
        "n_head": 2,
    }
    assert config["activation_function"] == "gelu_new" and config["tie_word_embeddings"] is True
    assert config["dtype"] == "float32" and config["bos_token_id"] is None  # no id 50256 in 256 byte tokens
    assert tensors["transformer.wte.weight"].shape == (256, 16)
    assert tensors["transformer.h.1.attn.c_attn.weight"].shape == (16, 48)  # Conv1D: [in, out]
    assert tensors["transformer.h.0.mlp.c_fc.weight"].shape == (16, 64)
    assert tensors["transformer.h.0.mlp.c_proj.weight"].shape == (64, 16)
    assert "lm_head.weight" not in tensors and all(t.dtype == torch.float32 for t in tensors.values())
    assert len(tensors) == 4 + 12 * 2


def test_names_without_the_prefix_mask_buffers_and_a_stored_head_are_read(tmp_path: Path) -> None:
    """GPT-2 as the hub has it: GPT2Model's names, old transformers' ``attn.bias`` buffers, and a head copy."""
    model = _model()
    tensors = {k.removeprefix("transformer."): v.clone() for k, v in model.state_dict().items()}  # head: a copy
    for layer in range(SMALL.n_layer):
        tensors[f"h.{layer}.attn.bias"] = torch.tril(torch.ones(1, 1, 32, 32))
        tensors[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    target = _write(tmp_path / "hub", SMALL.to_dict(), tensors)

    loaded = load_pretrained(target)

    assert loaded.weights_tied
    torch.testing.assert_close(_logits(loaded), _logits(model), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_weights_load_as_float32(tmp_path: Path, dtype: torch.dtype) -> None:
    model = _model()
    half = {k: v.to(dtype) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    target = _write(tmp_path / "half", {**SMALL.to_dict(), "dtype": str(dtype).removeprefix("torch.")}, half)

    loaded = load_pretrained(target)

    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    assert torch.equal(loaded.transformer.wte.weight, half["transformer.wte.weight"].float())
    torch.testing.assert_close(_logits(loaded), _logits(model), atol=0.05, rtol=0.05)


def test_sharded_weights_with_an_index_are_read(tmp_path: Path) -> None:
    model = _model()
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    names = sorted(state)
    target = tmp_path / "sharded"
    target.mkdir()
    (target / CONFIG_FILE).write_text(json.dumps(SMALL.to_dict()))
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(target / shard), {"format": "pt"})
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    (target / WEIGHTS_INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    torch.testing.assert_close(_logits(load_pretrained(target)), _logits(model), rtol=0, atol=0)

    (target / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="not a file beside it"):
        load_pretrained(target)


def test_an_untied_head_is_saved_and_read(tmp_path: Path) -> None:
    config = TinyGPTConfig(n_positions=32, n_embd=16, n_layer=1, n_head=2, tie_word_embeddings=False)
    model = _model(config)
    assert not model.weights_tied

    target = save_pretrained(model, tmp_path / "untied")
    loaded = load_pretrained(target)

    assert "lm_head.weight" in load_file(str(target / WEIGHTS_FILE))
    assert not loaded.weights_tied and loaded.config == config
    torch.testing.assert_close(_logits(loaded), _logits(model), rtol=0, atol=0)


def test_a_legacy_tinygpt_directory_is_converted(tmp_path: Path) -> None:
    """The layout earlier versions wrote: no prefix, ``nn.Linear`` weights ([out, in]), their own model_type."""
    model = _model()
    legacy = {}
    for key, tensor in model.state_dict().items():
        if key != "lm_head.weight":
            legacy[key.removeprefix("transformer.")] = tensor.t() if key.endswith(CONV1D_WEIGHTS) else tensor
    fields = {"vocab_size": 256, "n_positions": 32, "n_embd": 16, "n_layer": 2, "n_head": 2}
    target = _write(tmp_path / "legacy", {"model_type": "shardyard-tinygpt", **fields}, legacy)

    loaded = load_pretrained(target)

    assert is_legacy_layout(target) and loaded.config == SMALL
    torch.testing.assert_close(_logits(loaded), _logits(model), rtol=0, atol=0)
    resaved = save_pretrained(loaded, tmp_path / "resaved")
    assert not is_legacy_layout(resaved)
    assert json.loads((resaved / CONFIG_FILE).read_text())["model_type"] == "gpt2"


def test_missing_config_keys_take_gpt2_defaults_and_other_keys_are_kept(tmp_path: Path) -> None:
    raw = {"model_type": "gpt2", "n_embd": 16, "n_layer": 1, "n_head": 2, "n_ctx": 1024, "task_specific_params": {}}

    config = TinyGPTConfig.from_dict({**raw, "bos_token_id": 7, "transformers_version": "4.0"})
    written = config.to_dict()

    assert (config.vocab_size, config.n_positions, config.attn_pdrop) == (50257, 1024, 0.1)
    assert config == TinyGPTConfig(**{**HF_DEFAULTS, "n_embd": 16, "n_layer": 1, "n_head": 2})
    assert written["n_ctx"] == 1024 and written["task_specific_params"] == {} and written["bos_token_id"] == 7
    assert "transformers_version" not in written and written["eos_token_id"] is None
    assert TinyGPTConfig.from_dict({"model_type": "gpt2", "hidden_size": 32, "num_attention_heads": 4}).n_embd == 32


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"model_type": "llama"}, "model_type 'llama' is not supported", id="other-model-type"),
        pytest.param({"add_cross_attention": True}, "cross", id="cross-attention"),
        pytest.param({"activation_function": "xielu"}, "activation_function", id="activation"),
        pytest.param({"n_head": 3}, "divisible", id="heads"),
        pytest.param({"attn_pdrop": 1.5}, "attn_pdrop", id="dropout"),
        pytest.param({"n_inner": "big"}, "n_inner", id="n-inner"),
        pytest.param({"tie_word_embeddings": "yes"}, "tie_word_embeddings", id="tie"),
    ],
)
def test_configs_it_cannot_load_are_checkpoint_errors(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    target = save_pretrained(_model(), tmp_path / "ckpt")
    (target / CONFIG_FILE).write_text(json.dumps({**SMALL.to_dict(), **change}))

    with pytest.raises(CheckpointError, match=message):
        load_pretrained(target)


@pytest.mark.parametrize("how", ["pickle-only", "integer-tensor", "twice"])
def test_weights_it_cannot_load_are_checkpoint_errors(tmp_path: Path, how: str) -> None:
    target = save_pretrained(_model(), tmp_path / "ckpt")
    state = load_file(str(target / WEIGHTS_FILE))
    if how == "pickle-only":
        (target / WEIGHTS_FILE).rename(target / "pytorch_model.bin")
    elif how == "integer-tensor":
        state["transformer.wpe.weight"] = state["transformer.wpe.weight"].long()
        save_file(state, str(target / WEIGHTS_FILE), {"format": "pt"})
    else:
        state["wpe.weight"] = state["transformer.wpe.weight"].clone()
        save_file(state, str(target / WEIGHTS_FILE), {"format": "pt"})

    message = {"pickle-only": "only safetensors", "integer-tensor": "floating-point", "twice": "stored twice"}[how]
    with pytest.raises(CheckpointError, match=message):
        load_pretrained(target)


def test_dropout_follows_the_config_in_training_only() -> None:
    config = TinyGPTConfig(n_positions=32, n_embd=16, n_layer=1, n_head=2, embd_pdrop=0.5, resid_pdrop=0.5)
    model = _model(config)
    idx = torch.randint(0, 256, (2, 12))

    with torch.no_grad():
        assert torch.equal(model(idx), model(idx))  # eval: no dropout
        model.train()
        assert not torch.equal(model(idx), model(idx))


def test_loading_needs_no_random_initialisation(tmp_path: Path) -> None:
    """Every tensor comes from the file: the load leaves the global RNG where it was."""
    target = save_pretrained(_model(), tmp_path / "ckpt")
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)

    load_pretrained(target)

    assert torch.equal(torch.rand(3), expected)
