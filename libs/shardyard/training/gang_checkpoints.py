"""The gang's checkpoints in ``<output>/checkpoint``, written by rank 0: periodic ones (in the background) and the
preemption one (waited for).

Periodic checkpoints come every ``checkpoint_every`` parameter syncs, or with gradient averaging (which syncs every
step) every ``checkpoint_every`` x :data:`~shardyard.training.config.GRADIENT_CHECKPOINT_STEPS` steps. Every rank
takes part in each (rank 0 gathers every rank's optimizer state: with local SGD they differ).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist

from shardyard.training.checkpoint import (
    CheckpointWriter,
    TrainingState,
    checkpoint_files,
    optimizer_bytes,
    save_checkpoint,
)
from shardyard.training.config import RunConfig
from shardyard.training.errors import comm
from shardyard.training.model import TinyGPT
from shardyard.training.preemption import CHECKPOINT_SUBDIR
from shardyard.training.progress import ProgressReporter


class GangCheckpoints:
    def __init__(self, cfg: RunConfig, reporter: ProgressReporter) -> None:
        self.cfg = cfg
        self.reporter = reporter
        self.directory = cfg.output_dir / CHECKPOINT_SUBDIR
        self.writer = CheckpointWriter(self.directory, self._written) if cfg.rank == 0 else None
        self._snapshot_ms: dict[int, float] = {}

    def due(self, step: int, syncs: int) -> bool:
        """Whether a periodic checkpoint is due at ``step``, after the gang's ``syncs``-th sync."""
        every_steps = self.cfg.checkpoint_steps
        if every_steps is not None:
            return step % every_steps == 0
        return self.cfg.checkpoint_every > 0 and syncs % self.cfg.checkpoint_every == 0

    def _ranks(self, optimizer: torch.optim.Optimizer) -> dict[int, bytes]:
        """Every rank's optimizer state, gathered on rank 0 (a collective: every rank calls it at the same sync)."""
        if self.cfg.world_size == 1:
            return {}
        mine = optimizer_bytes(optimizer)
        gathered: list[object] | None = [None] * self.cfg.world_size if self.cfg.rank == 0 else None
        with comm("optimizer state gather"):
            dist.gather_object(mine, gathered, dst=0)
        return {rank: data for rank, data in enumerate(gathered or ()) if isinstance(data, bytes)}

    def submit(self, step: int, loss: float, model: TinyGPT, optimizer: torch.optim.Optimizer) -> None:
        ranks = self._ranks(optimizer)
        if self.writer is None:
            return
        t0 = time.perf_counter()
        files = checkpoint_files(model, optimizer, self._state(step, loss), ranks)
        self._snapshot_ms[step] = (time.perf_counter() - t0) * 1000.0
        self.writer.submit(step, files)

    def write_now(self, step: int, loss: float, model: TinyGPT, optimizer: torch.optim.Optimizer) -> None:
        """The preemption checkpoint, after any periodic one still being written; a failure to write it raises."""
        ranks = self._ranks(optimizer)
        if self.writer is not None:
            self.writer.wait()
            save_checkpoint(self.directory, model, optimizer, self._state(step, loss), ranks)

    def check(self) -> None:
        """Raise the full or failing disk a periodic checkpoint met (``CheckpointWriter.check``): rank 0 fails."""
        if self.writer is not None:
            self.writer.check()

    def close(self) -> None:
        """Waits for the checkpoint being written: a failing rank 0 still leaves its last sync behind."""
        if self.writer is not None:
            self.writer.close()

    def _state(self, step: int, loss: float) -> TrainingState:
        cfg = self.cfg
        return TrainingState(
            step=step, loss=loss, world_size=cfg.world_size, seed=cfg.seed, sync_interval=cfg.sync_interval
        )

    def _written(self, step: int, directory: Path, write_ms: float) -> None:
        snapshot_ms = self._snapshot_ms.pop(step, 0.0)
        self.reporter.checkpointed(step, directory, snapshot_ms=snapshot_ms, write_ms=write_ms)
