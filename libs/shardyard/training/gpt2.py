"""GPT-2 as Hugging Face's ``GPT2LMHeadModel`` computes it, without importing ``transformers``.

The modules and parameter names are GPT2LMHeadModel's (``transformer.wte.weight``,
``transformer.h.0.attn.c_attn.weight`` in Conv1D ``[in, out]`` layout, ..., ``lm_head.weight`` tied to
``transformer.wte.weight``), and the forward pass is its: learned positions, pre-LayerNorm blocks with
``layer_norm_epsilon``, causal attention scaled by ``head_dim ** -0.5`` (optionally also by ``1 / (layer + 1)``), the
configured activation, dropout where the config sets it. So its ``state_dict`` is a Hugging Face checkpoint, and
importing ``transformers`` (seconds) stays off a shard's start-up path. Reading and writing checkpoint directories is
:mod:`shardyard.training.model`'s.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

MODEL_TYPE = "gpt2"
ARCHITECTURE = "GPT2LMHeadModel"
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
"""The weights GPT-2 stores ``[in_features, out_features]`` (its Conv1D), the transpose of ``nn.Linear``'s."""

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    # transformers' ACT2FN names -> the same function ("gelu_new" is GPT-2's tanh approximation)
    "gelu_new": functools.partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
    "gelu_fast": functools.partial(F.gelu, approximate="tanh"),
    "gelu": F.gelu,
    "gelu_python": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
}

HF_DEFAULTS: dict[str, Any] = {
    # transformers.GPT2Config's defaults: what a config.json that leaves a key out means
    "vocab_size": 50257,
    "n_positions": 1024,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_inner": None,
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5,
    "initializer_range": 0.02,
    "embd_pdrop": 0.1,
    "attn_pdrop": 0.1,
    "resid_pdrop": 0.1,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "tie_word_embeddings": True,
}
_ALIASES = {  # GPT2Config.attribute_map
    "hidden_size": "n_embd",
    "max_position_embeddings": "n_positions",
    "num_attention_heads": "n_head",
    "num_hidden_layers": "n_layer",
}
_REWRITTEN = frozenset({"model_type", "architectures", "dtype", "torch_dtype", "transformers_version", *_ALIASES})
"""Keys of a loaded config.json that are not carried over as they were: this module writes its own."""


@dataclass(frozen=True)
class TinyGPTConfig:
    """The fields of ``transformers.GPT2Config`` that decide what the model computes, under the same names.

    The defaults are the demo's small byte-level model (256 tokens, no dropout); a config.json that leaves a key out
    means GPT2Config's default (:data:`HF_DEFAULTS`), see :meth:`from_dict`. ``extra`` holds the config.json's other
    keys (token ids, task parameters, ...), written back on save and ignored by equality.
    """

    vocab_size: int = 256
    n_positions: int = 128
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    embd_pdrop: float = 0.0
    attn_pdrop: float = 0.0
    resid_pdrop: float = 0.0
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    reorder_and_upcast_attn: bool = False
    """Only changes the precision of half-precision attention; the model trains in float32, where it changes nothing."""
    tie_word_embeddings: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner"):
            value = getattr(self, name)
            if (value is not None or name != "n_inner") and not _is_int(value, minimum=1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.activation_function not in _ACTIVATIONS:
            raise ValueError(f"activation_function {self.activation_function!r} is not one of {sorted(_ACTIVATIONS)}")
        for name in ("layer_norm_epsilon", "initializer_range", "embd_pdrop", "attn_pdrop", "resid_pdrop"):
            value = getattr(self, name)
            if not _is_number(value) or value < 0 or (name.endswith("pdrop") and value >= 1):
                raise ValueError(f"{name} must be a number >= 0{' and < 1' if name.endswith('pdrop') else ''}")
        flags = (
            "scale_attn_weights",
            "scale_attn_by_inverse_layer_idx",
            "reorder_and_upcast_attn",
            "tie_word_embeddings",
        )
        for name in flags:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @property
    def inner_size(self) -> int:
        return 4 * self.n_embd if self.n_inner is None else self.n_inner

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` that ``transformers.GPT2Config`` reads, for float32 weights."""
        kept = {k: v for k, v in self.extra.items() if k not in _REWRITTEN}
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        # A byte-level vocabulary has no spare id for GPT2Config's default bos/eos (50256): none, unless given.
        ids: dict[str, Any] = {"bos_token_id": None, "eos_token_id": None}
        return {**ids, **kept, "model_type": MODEL_TYPE, "architectures": [ARCHITECTURE], **own, "dtype": "float32"}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TinyGPTConfig:
        """Read a GPT-2 ``config.json`` as transformers does: a missing key takes GPT2Config's default."""
        if raw.get("model_type") != MODEL_TYPE:
            raise ValueError(f"model_type is {raw.get('model_type')!r}, expected {MODEL_TYPE!r}")
        if raw.get("add_cross_attention"):
            raise ValueError("add_cross_attention is set: encoder-decoder GPT-2 models are not supported")
        values = dict(HF_DEFAULTS)
        for alias, name in _ALIASES.items():
            if alias in raw:
                values[name] = raw[alias]
        values.update({k: raw[k] for k in HF_DEFAULTS if k in raw})
        extra = {k: v for k, v in raw.items() if k not in HF_DEFAULTS}
        return cls(**values, extra=extra)


def _is_int(value: object, *, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class Conv1D(nn.Module):
    """GPT-2's linear layer: ``weight`` is ``[in_features, out_features]``, ``y = x @ weight + bias``."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.n_out = n_out
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return out.view(*x.shape[:-1], self.n_out)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: TinyGPTConfig, layer: int) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.scale = (config.n_embd // config.n_head) ** -0.5 if config.scale_attn_weights else 1.0
        if config.scale_attn_by_inverse_layer_idx:
            self.scale /= float(layer + 1)
        self.attn_pdrop = config.attn_pdrop
        self.c_attn = Conv1D(config.n_embd, 3 * config.n_embd)
        self.c_proj = Conv1D(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, e = x.shape
        q, k, v = self.c_attn(x).split(e, dim=2)
        shape = (b, t, self.n_head, e // self.n_head)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        dropout = self.attn_pdrop if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=self.scale)
        out: torch.Tensor = self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, e)))
        return out


class MLP(nn.Module):
    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__()
        self.c_fc = Conv1D(config.n_embd, config.inner_size)
        self.c_proj = Conv1D(config.inner_size, config.n_embd)
        self.act = _ACTIVATIONS[config.activation_function]
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.dropout(self.c_proj(self.act(self.c_fc(x))))
        return out


class Block(nn.Module):
    def __init__(self, config: TinyGPTConfig, layer: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        out: torch.Tensor = x + self.mlp(self.ln_2(x))
        return out


class Transformer(nn.Module):
    """GPT2LMHeadModel's ``transformer`` (a GPT2Model): embeddings, blocks, final LayerNorm."""

    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__()
        # Uninitialised (TinyGPT initialises, or the loader assigns the checkpoint's tensors).
        self.wte = nn.Embedding(config.vocab_size, config.n_embd, _weight=torch.empty(config.vocab_size, config.n_embd))
        self.wpe = nn.Embedding(
            config.n_positions, config.n_embd, _weight=torch.empty(config.n_positions, config.n_embd)
        )
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(Block(config, layer) for layer in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        out: torch.Tensor = self.ln_f(x)
        return out


class LMHead(nn.Module):
    """The output projection (``nn.Linear`` without bias: ``weight`` is ``[vocab, n_embd]``), uninitialised."""

    def __init__(self, n_embd: int, vocab_size: int) -> None:
        super().__init__()
        self.weight: torch.Tensor = nn.Parameter(torch.empty(vocab_size, n_embd))  # a Tensor: tied, wte's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class TinyGPT(nn.Module):
    """GPT2LMHeadModel: the transformer and an LM head, tied to the token embedding unless the config says not.

    ``init_weights=False`` leaves the weights uninitialised, for a loader that replaces them all: no random draws
    (GPT-2's initialisation of a large model takes seconds), and no meta device (its first use imports
    ``torch._dynamo``, seconds again).
    """

    def __init__(self, config: TinyGPTConfig, *, init_weights: bool = True) -> None:
        super().__init__()
        self.config = config
        self.transformer = Transformer(config)
        self.lm_head = LMHead(config.n_embd, config.vocab_size)
        if config.tie_word_embeddings:
            self.tie_weights()
        if init_weights:
            self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        """GPT-2's: normal(0, initializer_range) weights, zero biases (LayerNorms start at one and zero), and the
        residual projections' weights scaled down by ``sqrt(2 * n_layer)``."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Embedding | Conv1D) or (module is self.lm_head and not self.weights_tied):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, Conv1D):
                nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=std / math.sqrt(2 * self.config.n_layer))

    def tie_weights(self) -> None:
        self.lm_head.weight = self.transformer.wte.weight

    @property
    def weights_tied(self) -> bool:
        return self.lm_head.weight is self.transformer.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """``idx``: LongTensor ``[batch, seq]`` of token ids; returns logits ``[batch, seq, vocab]``."""
        if idx.shape[1] > self.config.n_positions:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds n_positions={self.config.n_positions}")
        logits: torch.Tensor = self.lm_head(self.transformer(idx))
        return logits
