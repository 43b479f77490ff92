"""A gang's training state at a preemption, written by rank 0 and read back by every rank of the resumed gang.

Layout of ``<SHARDYARD_OUTPUT_DIR>/checkpoint/``, written as one atomic directory swap (see ``save_pretrained``)::

    config.json          the model config                  } exactly what save_pretrained writes, so the
    model.safetensors    the weights, averaged at the sync } directory also loads as a pretrained model
    optimizer.pt         rank 0's optimizer state (torch.save of a state_dict; read with weights_only=True)
    state.json           {"format": 1, "step": S, "loss": L, "world_size": W, "seed": ..., "sync_interval": ...}

``state.json`` is what makes the directory a training checkpoint; ``step`` is the last completed (and synced) step.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from shardyard.training.model import CheckpointError, TinyGPT, load_pretrained, save_pretrained

STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.pt"
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


def save_checkpoint(
    directory: str | os.PathLike[str], model: TinyGPT, optimizer: torch.optim.Optimizer, state: TrainingState
) -> Path:
    """Write weights, optimizer state and ``state.json`` to ``directory`` atomically, replacing what is there."""
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    loss = state.loss if state.loss is not None and math.isfinite(state.loss) else None
    document = {"format": FORMAT, **asdict(state), "loss": loss}
    return save_pretrained(
        model,
        directory,
        extra_files={
            STATE_FILE: (json.dumps(document, indent=2, sort_keys=True) + "\n").encode(),
            OPTIMIZER_FILE: buffer.getvalue(),
        },
    )


def load_checkpoint(directory: str | os.PathLike[str]) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`; any problem is a :class:`CheckpointError`."""
    root = Path(directory)
    model = load_pretrained(root)
    state = _read_state(root / STATE_FILE)
    optimizer_path = root / OPTIMIZER_FILE
    optimizer: dict[str, Any] | None = None
    if optimizer_path.is_file():
        try:
            loaded = torch.load(io.BytesIO(optimizer_path.read_bytes()), map_location="cpu", weights_only=True)
        except Exception as exc:  # unpickling errors come in many types
            raise CheckpointError(f"cannot read {optimizer_path}: {exc}") from exc
        if not isinstance(loaded, dict) or "state" not in loaded or "param_groups" not in loaded:
            raise CheckpointError(f"{optimizer_path} does not hold an optimizer state_dict")
        optimizer = loaded
    return Checkpoint(model=model, state=state, optimizer=optimizer)


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
