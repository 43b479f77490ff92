"""Hugging Face GPT-2 checkpoint directories: read and write them, atomically.

A pretrained model (the job's ``pretrained_model``), the runner's final output and every training checkpoint are a
Hugging Face directory: ``config.json`` (``model_type`` "gpt2") and ``model.safetensors`` with GPT2LMHeadModel's
tensor names, so ``transformers.AutoModelForCausalLM.from_pretrained(directory)`` loads them, and directories that
``transformers`` saved load here, without importing it (:mod:`shardyard.training.gpt2` computes what it does).

What :func:`load_pretrained` reads:

- ``model.safetensors``, or the shards listed by ``model.safetensors.index.json``; float32, bfloat16 or float16
  (trained in float32);
- tensor names with or without the ``transformer.`` prefix (GPT2LMHeadModel's or GPT2Model's, as on the hub), with
  or without ``lm_head.weight`` when the embeddings are tied (a stored copy is ignored, as transformers does), and
  the ``attn.bias`` mask buffers older transformers versions stored (ignored);
- the layout earlier Shardyard versions wrote (``model_type`` "shardyard-tinygpt": no prefix, ``nn.Linear`` weights),
  converted on load; it is saved back as GPT-2.

Anything else (another ``model_type``, ``pytorch_model.bin`` only, missing or misshapen tensors) is a
:class:`CheckpointError`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import glob
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.numpy import save as safetensors_numpy_bytes
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from shardyard.errors import ShardyardError
from shardyard.training.gpt2 import CONV1D_WEIGHTS, MODEL_TYPE, TinyGPT, TinyGPTConfig

__all__ = [
    "CONFIG_FILE",
    "MODEL_TYPE",
    "WEIGHTS_FILE",
    "WEIGHTS_INDEX_FILE",
    "CheckpointError",
    "TinyGPT",
    "TinyGPTConfig",
    "is_legacy_layout",
    "load_pretrained",
    "pretrained_files",
    "recover_leftovers",
    "save_pretrained",
    "tensor_bytes",
    "write_dir_atomic",
]

LEGACY_MODEL_TYPE = "shardyard-tinygpt"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
_PICKLED_WEIGHTS = "pytorch_model.bin"
_PREFIX = "transformer."
_HEAD_KEY = "lm_head.weight"  # tied: shares storage with "transformer.wte.weight", only the latter is stored
_MASK_BUFFER = re.compile(r"h\.\d+\.(attn|crossattention)\.(bias|masked_bias)")
_LEGACY_FIELDS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
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


class CheckpointError(ShardyardError):
    """A checkpoint directory is missing, incomplete, or holds no GPT-2 model this runner can load."""


def save_pretrained(
    model: TinyGPT,
    directory: str | os.PathLike[str],
    *,
    extra_files: Mapping[str, bytes] | None = None,
    keep: Sequence[str] = (),
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` into ``directory`` atomically, replacing what is there.

    ``extra_files`` (plain file names -> contents) are written alongside, and the subdirectories ``keep`` of what is
    there now are carried over, inside the same atomic swap; see :func:`write_dir_atomic`.
    """
    extra = dict(extra_files or {})
    for name in extra:
        if (
            name in (CONFIG_FILE, WEIGHTS_FILE, WEIGHTS_INDEX_FILE)
            or not name
            or name != Path(name).name
            or name.startswith(".")
        ):
            raise ValueError(f"extra checkpoint file name {name!r} is not a plain, free file name")
    return write_dir_atomic(directory, {**pretrained_files(model), **extra}, keep=keep)


def pretrained_files(model: TinyGPT) -> dict[str, bytes]:
    """The bytes of ``config.json`` and ``model.safetensors``: a snapshot of the model as it is now, as
    ``transformers``' ``save_pretrained`` writes a GPT2LMHeadModel (float32, the tied head not stored)."""
    tied = model.config.tie_word_embeddings
    if tied and not model.weights_tied:
        raise CheckpointError("the LM head is not tied to the token embedding; refusing to save a single copy")
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if not (tied and k == _HEAD_KEY)}
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


def write_dir_atomic(
    directory: str | os.PathLike[str], files: Mapping[str, bytes], *, keep: Sequence[str] = ()
) -> Path:
    """Write ``files`` (plain names -> bytes) as the directory ``directory``, replacing what is there atomically.

    The subdirectories named in ``keep`` that the target holds now are carried into the new one (hard links, a copy
    where the filesystem has none), so a reader of ``directory/<kept>`` finds it complete at every instant: the
    final model replaces an output directory whose ``checkpoint`` a re-formed gang may be about to resume from.

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
        for name in keep:
            if (target / name).is_dir():
                shutil.copytree(target / name, tmp / name, copy_function=_link_or_copy)
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
    """Load a GPT-2 checkpoint directory (see the module's docstring for what it reads), in eval mode, float32."""
    root = Path(directory)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist or is not a directory")
    raw = _read_config(root)
    legacy = raw.get("model_type") == LEGACY_MODEL_TYPE
    if raw.get("model_type") not in (MODEL_TYPE, LEGACY_MODEL_TYPE):
        raise CheckpointError(
            f"{root / CONFIG_FILE}: model_type {raw.get('model_type')!r} is not supported: the fine-tune runner"
            f" loads GPT-2 checkpoints (model_type {MODEL_TYPE!r}, GPT2LMHeadModel)"
        )
    try:
        config = (
            TinyGPTConfig(**{k: raw[k] for k in _LEGACY_FIELDS if k in raw}) if legacy else TinyGPTConfig.from_dict(raw)
        )
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"invalid {root / CONFIG_FILE}: {exc}") from exc
    model = TinyGPT(config, init_weights=False)  # every tensor comes from the file
    state = _model_state(_read_weights(root), model, legacy=legacy, where=root)
    model.load_state_dict(state, strict=False, assign=True)  # _model_state checked the names and shapes
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def is_legacy_layout(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` holds a model in the layout of earlier Shardyard versions (``nn.Linear`` weights)."""
    try:
        return _read_config(Path(directory)).get("model_type") == LEGACY_MODEL_TYPE
    except CheckpointError:
        return False


def _read_config(root: Path) -> dict[str, Any]:
    path = root / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint {root} has no {CONFIG_FILE}")
    try:
        raw = json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"invalid {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"invalid {path}: not a JSON object")
    return raw


def _read_weights(root: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``model.safetensors``, or of the shards ``model.safetensors.index.json`` lists."""
    index = root / WEIGHTS_INDEX_FILE
    if (root / WEIGHTS_FILE).is_file():
        files = [root / WEIGHTS_FILE]
    elif index.is_file():
        files = _index_files(index)
    elif (root / _PICKLED_WEIGHTS).is_file():
        raise CheckpointError(
            f"checkpoint {root} has {_PICKLED_WEIGHTS} but no {WEIGHTS_FILE}: only safetensors weights are read"
            " (no pickle); save it again with transformers' save_pretrained(directory, safe_serialization=True)"
        )
    else:
        raise CheckpointError(f"checkpoint {root} has no {WEIGHTS_FILE}")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            part = load_file(str(path))
        except Exception as exc:  # safetensors raises its own SafetensorError, plus OSError
            raise CheckpointError(f"cannot read {path}: {exc}") from exc
        if twice := sorted(part.keys() & tensors.keys()):
            raise CheckpointError(f"{path}: tensors {twice} are also in another shard")
        tensors.update(part)
    return tensors


def _index_files(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"invalid {index}: {exc!r}") from exc
    for name in names:
        if not isinstance(name, str) or name != Path(name).name or not (index.parent / name).is_file():
            raise CheckpointError(f"{index} lists the shard {name!r}, which is not a file beside it")
    return [index.parent / name for name in names]


def _model_state(
    tensors: Mapping[str, torch.Tensor], model: TinyGPT, *, legacy: bool, where: Path
) -> dict[str, torch.Tensor]:
    """The file's tensors under ``model``'s names, float32, checked against its names and shapes."""
    config = model.config
    state: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        name = key.removeprefix(_PREFIX)
        if _MASK_BUFFER.fullmatch(name) or (name == _HEAD_KEY and config.tie_word_embeddings):
            continue  # a causal-mask buffer; a copy of the tied embedding (transformers ties it to wte)
        if legacy and name.endswith(CONV1D_WEIGHTS):
            tensor = tensor.t()  # nn.Linear's [out, in] -> GPT-2's Conv1D [in, out]
        name = name if name == _HEAD_KEY else _PREFIX + name
        if name in state:
            raise CheckpointError(f"{where}: {name} is stored twice (with and without the {_PREFIX!r} prefix)")
        if not tensor.is_floating_point():
            raise CheckpointError(f"{where}: {key} is {tensor.dtype}, not a floating-point tensor")
        state[name] = tensor.to(torch.float32).contiguous()
    expected = model.state_dict()
    if config.tie_word_embeddings:
        del expected[_HEAD_KEY]
    missing, unexpected = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
    if missing or unexpected:
        raise CheckpointError(f"{where}: missing tensors {missing}, unexpected tensors {unexpected}")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(
                f"{where}: {name} has shape {tuple(tensor.shape)}, config.json implies {tuple(expected[name].shape)}"
            )
    return state


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


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


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    """An OSError raised inside names ``path``: a write or fsync that fails (``ENOSPC``, ``EIO``) names no file,
    and the shard's failure must say which (``shardyard.training.storage``)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), os.fspath(path)) from exc
        raise


def _write_synced(path: Path, data: bytes) -> None:
    with _naming(path), open(path, "xb") as fh:  # plain open(): the file mode follows the umask
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        with _naming(path):
            os.fsync(fd)
    finally:
        os.close(fd)
