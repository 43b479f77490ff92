"""Entry point of one training shard: ``python -m shardyard.training.runner`` (torchrun-style environment).

Exit codes are those of :mod:`shardyard.training.exitcodes`: OK, USER_ERROR (bad config, model or dataset),
COMM_ERROR (torch.distributed init/AllReduce/barrier failures and timeouts), INTERNAL_ERROR (anything else).
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import traceback
from collections.abc import Iterator, Mapping
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from shardyard.training import exitcodes
from shardyard.training.config import ConfigError, RunConfig
from shardyard.training.data import ByteDataset, DatasetError
from shardyard.training.model import CheckpointError, TinyGPT, load_pretrained, save_pretrained
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


def _load_inputs(cfg: RunConfig) -> tuple[TinyGPT, ByteDataset]:
    try:
        model = load_pretrained(cfg.model_dir)
        dataset = ByteDataset.from_dir(cfg.dataset_dir)
        dataset.check_seq_len(cfg.seq_len)
    except (CheckpointError, DatasetError) as exc:
        raise UserError(str(exc)) from exc
    if cfg.seq_len > model.config.n_positions:
        raise UserError(f"SHARDYARD_SEQ_LEN={cfg.seq_len} exceeds the model's n_positions={model.config.n_positions}")
    return model, dataset


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


def train(cfg: RunConfig, reporter: ProgressReporter) -> float:
    """Load, train ``max_steps`` steps with periodic parameter averaging, save on rank 0; returns the last loss."""
    _check_progress_fd(cfg.progress_fd)
    torch.set_num_threads(1)
    seed_everything(cfg.seed)
    model, dataset = _load_inputs(cfg)  # before the rendezvous: bad input fails fast, not after a timeout
    _init_process_group(cfg)
    reporter.started(world_size=cfg.world_size, rank=cfg.rank)

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    sync = ParamSync(list(model.parameters()))
    stream = dataset.batches(cfg.rank, cfg.world_size, cfg.batch_size, cfg.seq_len, cfg.seed)
    stats, syncs, loss_value = SyncStats(ms=0.0, bytes=0, buckets=0), 0, float("nan")
    for step in range(1, cfg.max_steps + 1):
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
                stats = sync.allreduce_mean()
            syncs += 1
        reporter.progress(
            step=step,
            loss=loss_value,
            samples=step * cfg.batch_size,
            allreduce_ms=stats.ms,
            allreduce_bytes=stats.bytes,
            syncs=syncs,
            force=is_sync,
        )

    if cfg.rank == 0:
        save_pretrained(model, cfg.output_dir)
    with _comm("final barrier"):
        dist.barrier()
    dist.destroy_process_group()
    checkpoint_dir = cfg.output_dir if cfg.rank == 0 else None
    reporter.finished(final_loss=loss_value, steps=cfg.max_steps, checkpoint_dir=checkpoint_dir)
    return loss_value


def main(env: Mapping[str, str] | None = None) -> int:
    try:
        cfg = RunConfig.from_env(os.environ if env is None else env)
    except ConfigError as exc:
        print(f"{_PREFIX}: {exc}", file=sys.stderr)
        return exitcodes.USER_ERROR
    where = f"{_PREFIX}[rank {cfg.rank}/{cfg.world_size}]"
    reporter = ProgressReporter(cfg.progress_fd)
    try:
        train(cfg, reporter)
        return exitcodes.OK
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


if __name__ == "__main__":
    sys.exit(main())
