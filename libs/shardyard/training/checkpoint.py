"""A gang's training state at a sync, written by rank 0 and read back by every rank of a resumed gang.

Rank 0 writes it after every ``checkpoint_every`` syncs (recovery resumes from the last one) and when the gang stops
on request (preemption). Layout of ``<SHARDYARD_OUTPUT_DIR>/checkpoint/``, written as one atomic directory swap (see
``write_dir_atomic``)::

    config.json            the model config                  } exactly what save_pretrained writes, so the
    model.safetensors      the weights, averaged at the sync } directory also loads as a pretrained model, here
                                                               and with transformers (a Hugging Face GPT-2)
    optimizer.safetensors  rank 0's optimizer state: tensors as ``<param id>.<name>``, ``param_groups`` and
                           non-tensor values as JSON in the metadata (no pickle)
    state.json             {"format": 1, "step": S, "loss": L, "world_size": W, "seed": ..., "sync_interval": ...}

``state.json`` is what makes the directory a training checkpoint; ``step`` is the last completed (and synced) step.
An ``optimizer.pt`` (``torch.save`` of a state_dict, written by earlier versions) is still read, and so is a checkpoint
whose model is in the layout of earlier versions (its linear weights' moments are transposed as the weights are).

Rank 0 of a broken gang may still be writing while rank 0 of its re-formed gang starts, so two processes may write
one directory: every write holds ``.<name>.lock`` (``flock``) and a periodic write never replaces a checkpoint of a
later step (:func:`write_if_newer`).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from shardyard.training.gpt2 import CONV1D_WEIGHTS
from shardyard.training.model import (
    CheckpointError,
    TinyGPT,
    is_legacy_layout,
    load_pretrained,
    pretrained_files,
    recover_leftovers,
    tensor_bytes,
    write_dir_atomic,
)
from shardyard.training.storage import fault_of

STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
LEGACY_OPTIMIZER_FILE = "optimizer.pt"
FORMAT = 1


@dataclass(frozen=True)
class TrainingState:
    step: int
    """Steps completed; training resumes at ``step + 1``."""
    loss: float | None
    """The loss of step ``step`` on rank 0 (None when it was not finite)."""
    world_size: int
    seed: int
    sync_interval: int


@dataclass
class Checkpoint:
    model: TinyGPT
    state: TrainingState
    optimizer: dict[str, Any] | None
    """An optimizer ``state_dict``, or None when the checkpoint has none."""


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> bytes:
    """One rank's optimizer state as the checkpoint stores it (rank 0 gathers every rank's)."""
    return _optimizer_bytes(optimizer.state_dict())


def rank_optimizer_file(rank: int) -> str:
    """Rank ``rank``'s optimizer state (rank 0's is :data:`OPTIMIZER_FILE`): with local SGD every rank's moments
    differ, and a gang that resumes with each rank's own state continues exactly where it stopped."""
    return OPTIMIZER_FILE if rank == 0 else f"optimizer-rank{rank}.safetensors"


def checkpoint_files(
    model: TinyGPT,
    optimizer: torch.optim.Optimizer,
    state: TrainingState,
    ranks: Mapping[int, bytes] | None = None,
) -> dict[str, bytes]:
    """The checkpoint's files as bytes: a consistent snapshot of the model and optimizer as they are now, plus the
    other ranks' optimizer states (``ranks``: rank -> :func:`optimizer_bytes`)."""
    loss = state.loss if state.loss is not None and math.isfinite(state.loss) else None
    document = {"format": FORMAT, **asdict(state), "loss": loss}
    others = {rank_optimizer_file(rank): data for rank, data in (ranks or {}).items() if rank != 0}
    return {
        **pretrained_files(model),
        OPTIMIZER_FILE: _optimizer_bytes(optimizer.state_dict()),
        **others,
        STATE_FILE: (json.dumps(document, indent=2, sort_keys=True) + "\n").encode(),
    }


def save_checkpoint(
    directory: str | os.PathLike[str],
    model: TinyGPT,
    optimizer: torch.optim.Optimizer,
    state: TrainingState,
    ranks: Mapping[int, bytes] | None = None,
) -> Path:
    """Write weights, optimizer state and ``state.json`` to ``directory`` atomically, replacing what is there."""
    with directory_lock(directory):
        return write_dir_atomic(directory, checkpoint_files(model, optimizer, state, ranks))


@contextlib.contextmanager
def directory_lock(directory: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the exclusive lock of checkpoint ``directory`` (a sibling ``.<name>.lock``; released when the holder
    dies)."""
    target = Path(directory).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target.parent / f".{target.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def checkpoint_step(directory: str | os.PathLike[str]) -> int | None:
    """The step of the checkpoint in ``directory``; None when there is none (or it cannot be read)."""
    try:
        return _read_state(Path(directory) / STATE_FILE).step
    except CheckpointError:
        return None


def write_if_newer(directory: str | os.PathLike[str], files: Mapping[str, bytes], step: int) -> bool:
    """Put ``files`` (a checkpoint of ``step``) in place unless ``directory`` already holds one of ``step`` or later;
    True when written."""
    with directory_lock(directory):
        held = checkpoint_step(directory)
        if held is not None and held >= step:
            return False
        write_dir_atomic(directory, files)
        return True


Written = Callable[[int, Path, float], None]
"""``on_written(step, directory, write_ms)``, called on the writer's thread once a checkpoint is in place."""


class CheckpointWriter:
    """Writes the checkpoints of one directory on a background thread, in order, one at a time.

    The training thread takes the snapshot (:func:`checkpoint_files`, the CPU part) and hands the bytes over; the
    writer does the part that waits on the disk (fsyncs, the swap) while training goes on. A new checkpoint waits
    for the one before it. A write that fails is reported on stderr and the previous checkpoint stays in place.
    Training goes on, unless the disk is full or failing (:mod:`shardyard.training.storage`): then :meth:`check`
    raises that error on the training thread, at its next step. Steps trained on such a disk could never be saved,
    the final model neither, so the shard fails DISK_FULL or IO_ERROR at once, and its job moves to a disk with
    room and resumes from the checkpoint in place. Leftovers of a writer that died mid-write are tidied up first.
    """

    def __init__(self, directory: Path, on_written: Written) -> None:
        self.directory = directory
        self._on_written = on_written
        with directory_lock(directory):  # not under a rescue write of a shard of an earlier attempt
            recover_leftovers(directory)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending: Future[None] | None = None
        self.fault: OSError | CheckpointError | None = None
        """The full or failing disk a write met (set on the writer's thread, raised by :meth:`check`)."""

    def submit(self, step: int, files: Mapping[str, bytes]) -> None:
        self.wait()
        self._pending = self._pool.submit(self._write, step, dict(files))

    def wait(self) -> None:
        """Until the checkpoint being written (if any) is in place or has failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        self.wait()
        self._pool.shutdown()

    def check(self) -> None:
        """Raise the storage fault a write met, if any (see the class's docstring)."""
        if self.fault is not None:
            raise self.fault

    def _write(self, step: int, files: dict[str, bytes]) -> None:
        t0 = time.perf_counter()
        try:
            written = write_if_newer(self.directory, files, step)
        except (OSError, CheckpointError) as exc:
            if fault_of(exc) is not None:
                self.fault = exc
            with contextlib.suppress(OSError):  # stderr may be on the disk that filled
                print(f"shardyard.training: checkpoint of step {step} not written: {exc}", file=sys.stderr)
            return
        if written:
            self._on_written(step, self.directory, (time.perf_counter() - t0) * 1000.0)


def load_checkpoint(directory: str | os.PathLike[str], *, rank: int = 0) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`, with ``rank``'s own optimizer state when the checkpoint
    has it, else that of rank ``rank mod W`` of the gang of ``W`` that wrote it (an elastic gang resumed at another
    world size, with local SGD), else rank 0's; any problem is a :class:`CheckpointError`."""
    root = Path(directory)
    model = load_pretrained(root)
    state = _read_state(root / STATE_FILE)
    optimizer: dict[str, Any] | None = None
    candidates = (rank_optimizer_file(rank), rank_optimizer_file(rank % state.world_size), OPTIMIZER_FILE)
    if (found := next((root / name for name in candidates if (root / name).is_file()), None)) is not None:
        optimizer = _read_optimizer(found)
    elif (root / LEGACY_OPTIMIZER_FILE).is_file():
        optimizer = _read_legacy_optimizer(root / LEGACY_OPTIMIZER_FILE)
    if optimizer is not None and is_legacy_layout(root):
        _transpose_linear_moments(model, optimizer)
    return Checkpoint(model=model, state=state, optimizer=optimizer)


def _transpose_linear_moments(model: TinyGPT, optimizer: dict[str, Any]) -> None:
    """Earlier versions stored the linear weights as ``nn.Linear`` (``[out, in]``), GPT-2 as Conv1D (``[in, out]``):
    the loader transposed the weights, and their optimizer moments follow. The state's parameter ids are the
    positions in ``model.parameters()`` (the runner's one parameter group), the same order in both layouts."""
    names = [name for name, _ in model.named_parameters()]
    for param_id, entries in optimizer["state"].items():
        if isinstance(param_id, int) and 0 <= param_id < len(names) and names[param_id].endswith(CONV1D_WEIGHTS):
            for key, value in entries.items():
                if isinstance(value, torch.Tensor) and value.dim() == 2:
                    entries[key] = value.t().contiguous()


def _optimizer_bytes(state_dict: dict[str, Any]) -> bytes:
    tensors: dict[str, torch.Tensor] = {}
    values: dict[str, Any] = {}
    for param_id, entries in state_dict["state"].items():
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{param_id}.{name}"] = value.detach().cpu().contiguous()
            else:
                values[f"{param_id}.{name}"] = value
    try:
        metadata = {"param_groups": json.dumps(state_dict["param_groups"]), "values": json.dumps(values)}
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"the optimizer state has values JSON cannot hold: {exc}") from exc
    return tensor_bytes(tensors, metadata)


def _read_optimizer(path: Path) -> dict[str, Any]:
    try:
        with safe_open(str(path), "pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - not a dict
        groups = json.loads(metadata["param_groups"])
        values = json.loads(metadata.get("values", "{}"))
        state: dict[int, dict[str, Any]] = {}
        for key, value in [*tensors.items(), *values.items()]:
            param_id, name = key.split(".", 1)
            state.setdefault(int(param_id), {})[name] = value
    except Exception as exc:  # safetensors raises its own SafetensorError; bad metadata many kinds
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(groups, list):
        raise CheckpointError(f"{path} does not hold an optimizer state")
    return {"state": dict(sorted(state.items())), "param_groups": groups}  # in parameter order, as saved


def _read_legacy_optimizer(path: Path) -> dict[str, Any]:
    try:
        loaded = torch.load(io.BytesIO(path.read_bytes()), map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling errors come in many types
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(loaded, dict) or "state" not in loaded or "param_groups" not in loaded:
        raise CheckpointError(f"{path} does not hold an optimizer state_dict")
    return loaded


def _read_state(path: Path) -> TrainingState:
    if not path.is_file():
        raise CheckpointError(f"{path.parent} has no {path.name}: it is not a training checkpoint")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a format-{FORMAT} training state")

    def integer(name: str, minimum: int) -> int:
        value = raw.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise CheckpointError(f"{path}: {name} must be an integer >= {minimum}, got {value!r}")
        return value

    loss = raw.get("loss")
    if loss is not None and (not isinstance(loss, int | float) or isinstance(loss, bool)):
        raise CheckpointError(f"{path}: loss must be a number or null, got {loss!r}")
    return TrainingState(
        step=integer("step", 0),
        loss=None if loss is None else float(loss),
        world_size=integer("world_size", 1),
        seed=integer("seed", 0),
        sync_interval=integer("sync_interval", 1),
    )
