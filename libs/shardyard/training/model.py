"""A small GPT-2-style causal language model over bytes, with atomic safetensors checkpoints."""

from __future__ import annotations

import ctypes
import errno
import functools
import glob
import json
import math
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.numpy import save as safetensors_numpy_bytes
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import nn

MODEL_TYPE = "shardyard-tinygpt"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
_TIED_KEY = "lm_head.weight"  # shares storage with "wte.weight"; only the latter is stored
_TMP_MARK = ".tmp-"
_OLD_MARK = ".old-"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_NUMPY_DTYPES = frozenset(
    {
        torch.float16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    }
)


class CheckpointError(Exception):
    """A checkpoint directory is missing, incomplete or does not hold a TinyGPT."""


@dataclass(frozen=True)
class TinyGPTConfig:
    vocab_size: int = 256
    n_positions: int = 128
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TinyGPTConfig.{f.name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")

    def to_dict(self) -> dict[str, Any]:
        return {"model_type": MODEL_TYPE, **asdict(self)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TinyGPTConfig:
        """Build from a ``config.json`` mapping; unknown keys are ignored, missing ones take defaults."""
        if raw.get("model_type") != MODEL_TYPE:
            raise ValueError(f"model_type is {raw.get('model_type')!r}, expected {MODEL_TYPE!r}")
        return cls(**{f.name: raw[f.name] for f in fields(cls) if f.name in raw})


class CausalSelfAttention(nn.Module):
    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, e = x.shape
        q, k, v = self.c_attn(x).split(e, dim=2)
        shape = (b, t, self.n_head, e // self.n_head)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.c_proj(y.transpose(1, 2).reshape(b, t, e))
        return out


class MLP(nn.Module):
    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))
        return out


class Block(nn.Module):
    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        out: torch.Tensor = x + self.mlp(self.ln_2(x))
        return out


class TinyGPT(nn.Module):
    """Token + learned position embeddings, pre-LN blocks, final LN, LM head tied to the token embedding."""

    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        self.lm_head.weight = self.wte.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @property
    def weights_tied(self) -> bool:
        return self.lm_head.weight is self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """``idx``: LongTensor ``[batch, seq]`` of byte ids; returns logits ``[batch, seq, vocab]``."""
        t = idx.shape[1]
        if t > self.config.n_positions:
            raise ValueError(f"sequence length {t} exceeds n_positions={self.config.n_positions}")
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits: torch.Tensor = self.lm_head(self.ln_f(x))
        return logits


def save_pretrained(
    model: TinyGPT, directory: str | os.PathLike[str], *, extra_files: Mapping[str, bytes] | None = None
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` into ``directory`` atomically, replacing what is there.

    ``extra_files`` (plain file names -> contents) are written alongside, inside the same atomic swap; see
    :func:`write_dir_atomic`.
    """
    extra = dict(extra_files or {})
    for name in extra:
        if name in (CONFIG_FILE, WEIGHTS_FILE) or not name or name != Path(name).name or name.startswith("."):
            raise ValueError(f"extra checkpoint file name {name!r} is not a plain, free file name")
    return write_dir_atomic(directory, {**pretrained_files(model), **extra})


def pretrained_files(model: TinyGPT) -> dict[str, bytes]:
    """The bytes of ``config.json`` and ``model.safetensors``: a snapshot of the model as it is now."""
    if not model.weights_tied:
        raise CheckpointError("the LM head is not tied to the token embedding; refusing to save a single copy")
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k != _TIED_KEY}
    return {
        WEIGHTS_FILE: tensor_bytes(state, {"format": "pt"}),
        CONFIG_FILE: (json.dumps(model.config.to_dict(), indent=2, sort_keys=True) + "\n").encode(),
    }


def tensor_bytes(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> bytes:
    """A safetensors file of CPU ``tensors``. Through numpy where every dtype allows it: ``safetensors.torch``
    spends ~40 us per tensor on bookkeeping, numpy's path writes the same bytes several times faster."""
    if all(t.dtype in _NUMPY_DTYPES for t in tensors.values()):
        return safetensors_numpy_bytes({k: t.numpy() for k, t in tensors.items()}, metadata=dict(metadata))
    return safetensors_bytes(dict(tensors), metadata=dict(metadata))


def write_dir_atomic(directory: str | os.PathLike[str], files: Mapping[str, bytes]) -> Path:
    """Write ``files`` (plain names -> bytes) as the directory ``directory``, replacing what is there atomically.

    The files are written and fsynced in a sibling temp directory which then takes the target's place: on Linux by
    one ``renameat2(RENAME_EXCHANGE)``, so the target always holds the old or the new checkpoint, complete, whenever
    the writer dies. Where the exchange is not available (another OS, a filesystem without it) it takes two renames
    and for an instant there is no directory at all; the old one then sits in ``.<name>.old-*``, which
    :func:`recover_leftovers` puts back.
    """
    target = Path(directory).absolute()
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"{target} exists and is not a directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}{_TMP_MARK}{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        for name, data in files.items():
            _write_synced(tmp / name, data)
        _fsync_path(tmp)
        _swap_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_path(target.parent)
    return target


def recover_leftovers(directory: str | os.PathLike[str]) -> None:
    """Tidy up after a writer of ``directory`` that died mid-write: its temp directories go; if the directory itself
    is missing (a death between the two renames of the fallback swap), the newest old copy is put back."""
    target = Path(directory).absolute()
    if not target.parent.is_dir():
        return
    name = glob.escape(target.name)
    olds = sorted(target.parent.glob(f".{name}{_OLD_MARK}*"), key=lambda p: p.stat().st_mtime)
    if olds and not target.exists():
        os.rename(olds.pop(), target)
    for leftover in [*olds, *target.parent.glob(f".{name}{_TMP_MARK}*")]:
        shutil.rmtree(leftover, ignore_errors=True)


def load_pretrained(directory: str | os.PathLike[str]) -> TinyGPT:
    """Load a checkpoint written by :func:`save_pretrained` (returned in eval mode, weights re-tied)."""
    root = Path(directory)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist or is not a directory")
    config_path, weights_path = root / CONFIG_FILE, root / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise CheckpointError(f"checkpoint {root} has no {path.name}")
    try:
        raw = json.loads(config_path.read_text())
        if not isinstance(raw, dict):
            raise ValueError("config.json is not a JSON object")
        config = TinyGPTConfig.from_dict(raw)
    except (ValueError, TypeError, OSError) as exc:
        raise CheckpointError(f"invalid {config_path}: {exc}") from exc
    try:
        state = load_file(str(weights_path))
    except Exception as exc:  # safetensors raises its own SafetensorError, plus OSError
        raise CheckpointError(f"cannot read {weights_path}: {exc}") from exc
    model = TinyGPT(config)
    expected = {k: v for k, v in model.state_dict().items() if k != _TIED_KEY}
    missing, unexpected = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
    if missing or unexpected:
        raise CheckpointError(f"{weights_path}: missing tensors {missing}, unexpected tensors {unexpected}")
    for key, tensor in state.items():
        if tensor.shape != expected[key].shape:
            raise CheckpointError(
                f"{weights_path}: {key} has shape {tuple(tensor.shape)}, config implies {tuple(expected[key].shape)}"
            )
    model.load_state_dict(state, strict=False)  # only the tied lm_head.weight is absent
    model.lm_head.weight = model.wte.weight
    return model.eval()


def _swap_into_place(tmp: Path, target: Path) -> None:
    if not target.exists():
        os.rename(tmp, target)
        return
    if _exchange(tmp, target):
        shutil.rmtree(tmp, ignore_errors=True)  # it holds the old checkpoint now
        return
    old = target.parent / f".{target.name}{_OLD_MARK}{uuid.uuid4().hex}"
    os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2`` with ``RENAME_EXCHANGE``); False where that is unsupported."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


@functools.cache
def _renameat2() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "xb") as fh:  # plain open(): the file mode follows the umask
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
