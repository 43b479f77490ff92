"""Entry point of one training shard: ``python -m shardyard.training.runner`` (torchrun-style environment).

Exit codes are those of :mod:`shardyard.training.exitcodes`: OK, USER_ERROR (bad config, model, dataset or resume
checkpoint), COMM_ERROR (torch.distributed init/AllReduce/barrier failures and timeouts), PREEMPTED (stopped on
request after checkpointing, see :mod:`shardyard.training.preemption`), INTERNAL_ERROR (anything else).
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from shardyard.training import exitcodes
from shardyard.training.checkpoint import Checkpoint, TrainingState, load_checkpoint, save_checkpoint
from shardyard.training.config import ConfigError, RunConfig
from shardyard.training.data import ByteDataset, DatasetError
from shardyard.training.model import CheckpointError, TinyGPT, load_pretrained, save_pretrained
from shardyard.training.preemption import CHECKPOINT_SUBDIR, StopFlag
from shardyard.training.progress import ProgressReporter
from shardyard.training.sync import ParamSync, SyncStats

_PREFIX = "shardyard.training"


class UserError(Exception):
    """A problem with what the user supplied (config, checkpoint, dataset): exit USER_ERROR."""


class CommError(Exception):
    """A torch.distributed failure or timeout: exit COMM_ERROR."""


@contextlib.contextmanager
def _comm(what: str) -> Iterator[None]:
    """Errors raised inside are communication failures (gloo raises plain RuntimeErrors, not only DistError)."""
    try:
        yield
    except (RuntimeError, OSError, TimeoutError, ValueError) as exc:
        cause = " ".join(str(exc).split()) or type(exc).__name__
        raise CommError(f"{what} failed: {type(exc).__name__}: {cause}") from exc


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _load_inputs(cfg: RunConfig) -> tuple[TinyGPT, ByteDataset, Checkpoint | None]:
    """The model (from the resume checkpoint when there is one, else the pretrained one) and the dataset."""
    try:
        resumed = None if cfg.resume_dir is None else load_checkpoint(cfg.resume_dir)
        model = load_pretrained(cfg.model_dir) if resumed is None else resumed.model
        dataset = ByteDataset.from_dir(cfg.dataset_dir)
        dataset.check_seq_len(cfg.seq_len)
    except (CheckpointError, DatasetError) as exc:
        raise UserError(str(exc)) from exc
    if cfg.seq_len > model.config.n_positions:
        raise UserError(f"SHARDYARD_SEQ_LEN={cfg.seq_len} exceeds the model's n_positions={model.config.n_positions}")
    if resumed is not None and resumed.state.step > cfg.max_steps:
        raise UserError(
            f"checkpoint {cfg.resume_dir} is at step {resumed.state.step}, past SHARDYARD_MAX_STEPS={cfg.max_steps}"
        )
    return model, dataset, resumed


def _restore_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any], lr: float) -> None:
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise UserError(f"the checkpoint's optimizer state does not fit the model: {exc}") from exc
    for group in optimizer.param_groups:
        group["lr"] = lr  # the run's configuration wins over the saved hyper-parameters


def _check_progress_fd(fd: int | None) -> None:
    if fd is None:
        return
    try:
        os.fstat(fd)
    except OSError as exc:
        raise UserError(f"SHARDYARD_PROGRESS_FD={fd} is not an open file descriptor ({exc.strerror})") from exc


def _init_process_group(cfg: RunConfig) -> None:
    os.environ.update(MASTER_ADDR=cfg.master_addr, MASTER_PORT=str(cfg.master_port))
    with _comm(f"init_process_group(gloo, {cfg.master_addr}:{cfg.master_port}, world_size={cfg.world_size})"):
        dist.init_process_group(
            "gloo",
            init_method="env://",
            rank=cfg.rank,
            world_size=cfg.world_size,
            timeout=timedelta(seconds=cfg.dist_timeout_s),
        )


@dataclass(frozen=True)
class Outcome:
    steps: int
    """The last step completed: ``max_steps``, or the step the gang stopped at."""
    loss: float
    preempted: bool


def train(cfg: RunConfig, reporter: ProgressReporter, stop: StopFlag) -> Outcome:
    """Load (or resume), train to ``max_steps`` with periodic parameter averaging and save on rank 0.

    When ``stop`` is raised on any rank, the gang stops at its next sync before ``max_steps``: rank 0 writes a
    checkpoint to ``<output>/checkpoint`` and every rank reports ``preempted`` at that step.
    """
    _check_progress_fd(cfg.progress_fd)
    torch.set_num_threads(1)
    seed_everything(cfg.seed)
    model, dataset, resumed = _load_inputs(cfg)  # before the rendezvous: bad input fails fast, not after a timeout
    start = 0 if resumed is None else resumed.state.step
    if resumed is not None:
        print(f"{_PREFIX}[rank {cfg.rank}]: resuming from {cfg.resume_dir} at step {start}", file=sys.stderr)
    _init_process_group(cfg)
    reporter.started(world_size=cfg.world_size, rank=cfg.rank)

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    if resumed is not None and resumed.optimizer is not None:
        _restore_optimizer(optimizer, resumed.optimizer, cfg.lr)
    sync = ParamSync(list(model.parameters()))
    stream = dataset.batches(cfg.rank, cfg.world_size, cfg.batch_size, cfg.seq_len, cfg.seed, start_step=start)
    stats, syncs = SyncStats(ms=0.0, bytes=0, buckets=0), 0
    loss_value = float("nan") if resumed is None or resumed.state.loss is None else resumed.state.loss
    step, stopped = start, False
    for step in range(start + 1, cfg.max_steps + 1):
        inputs, targets = next(stream)
        logits = model(inputs)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        optimizer.step()
        loss_value = float(loss.item())
        is_sync = step % cfg.sync_interval == 0 or step == cfg.max_steps  # always end on a sync
        if is_sync:
            with _comm(f"parameter AllReduce at step {step}"):
                # At the last step the run is complete: finishing beats checkpointing.
                stats = sync.allreduce_mean(stop=stop.requested and step < cfg.max_steps)
            syncs += 1
            stopped = stats.stop
        reporter.progress(
            step=step,
            loss=loss_value,
            samples=(step - start) * cfg.batch_size,
            allreduce_ms=stats.ms,
            allreduce_bytes=stats.bytes,
            syncs=syncs,
            force=is_sync,
        )
        if stopped:
            break

    if stopped:
        checkpoint = cfg.output_dir / CHECKPOINT_SUBDIR
        if cfg.rank == 0:
            state = TrainingState(
                step=step, loss=loss_value, world_size=cfg.world_size, seed=cfg.seed, sync_interval=cfg.sync_interval
            )
            save_checkpoint(checkpoint, model, optimizer, state)
        with _comm("checkpoint barrier"):  # nobody reports before the checkpoint is complete
            dist.barrier()
        dist.destroy_process_group()
        reporter.preempted(step=step, checkpoint_dir=checkpoint if cfg.rank == 0 else None)
        return Outcome(steps=step, loss=loss_value, preempted=True)

    if cfg.rank == 0:
        save_pretrained(model, cfg.output_dir)
    with _comm("final barrier"):
        dist.barrier()
    dist.destroy_process_group()
    checkpoint_dir = cfg.output_dir if cfg.rank == 0 else None
    reporter.finished(final_loss=loss_value, steps=cfg.max_steps, checkpoint_dir=checkpoint_dir)
    return Outcome(steps=cfg.max_steps, loss=loss_value, preempted=False)


def main(env: Mapping[str, str] | None = None, stop: StopFlag | None = None) -> int:
    stop = StopFlag.install() if stop is None else stop  # first: a stop request must never kill the shard
    try:
        cfg = RunConfig.from_env(os.environ if env is None else env)
    except ConfigError as exc:
        print(f"{_PREFIX}: {exc}", file=sys.stderr)
        return exitcodes.USER_ERROR
    where = f"{_PREFIX}[rank {cfg.rank}/{cfg.world_size}]"
    reporter = ProgressReporter(cfg.progress_fd)
    try:
        outcome = train(cfg, reporter, stop)
    except UserError as exc:
        print(f"{where}: user error: {exc}", file=sys.stderr)
        return exitcodes.USER_ERROR
    except CommError as exc:
        print(f"{where}: communication error: {exc}", file=sys.stderr)
        return exitcodes.COMM_ERROR
    except Exception:
        print(f"{where}: internal error:\n{traceback.format_exc()}", file=sys.stderr)
        return exitcodes.INTERNAL_ERROR
    finally:
        reporter.close()
    if outcome.preempted:
        print(f"{where}: preempted at step {outcome.steps}", file=sys.stderr)
        return exitcodes.PREEMPTED
    return exitcodes.OK


if __name__ == "__main__":
    sys.exit(main())
