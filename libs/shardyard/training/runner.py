"""Entry point of one training shard: ``python -m shardyard.training.runner`` (torchrun-style environment).

Exit codes are those of :mod:`shardyard.training.exitcodes`: OK, USER_ERROR (bad config, model, dataset or resume
checkpoint), COMM_ERROR (torch.distributed init/AllReduce/barrier failures), SYNC_TIMEOUT (a parameter sync
past ``SHARDYARD_SYNC_TIMEOUT_S``), OOM and GPU_FAULT (out of memory; a CUDA error that points at the device),
PREEMPTED (stopped on request after checkpointing, see :mod:`shardyard.training.preemption`), INTERNAL_ERROR
(anything else).

Rank 0 checkpoints the gang every ``SHARDYARD_CHECKPOINT_EVERY`` syncs to ``<output>/checkpoint`` (in the background,
see :class:`CheckpointWriter`), so a gang that fails resumes having lost at most that many sync intervals. SIGTERM
(the agent revokes the shard when its gang is re-formed) ends the shard between two steps, after the checkpoint being
written is in place: a surviving rank 0 always leaves the gang's last sync behind.

The checkpoint holds every rank's optimizer state at the sync, so a gang resumed from it continues exactly as it would
have without the fault. A checkpoint of a survivor's own state after the sync (its local steps) would lose fewer steps
but not that: tried, it moved the final loss of the recovery test's job by 15-20 %, since the ranks resume with one
rank's optimizer moments and parameters that were never averaged.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from shardyard import tracing
from shardyard.training import exitcodes
from shardyard.training.checkpoint import (
    Checkpoint,
    CheckpointWriter,
    TrainingState,
    checkpoint_files,
    load_checkpoint,
    optimizer_bytes,
    save_checkpoint,
)
from shardyard.training.config import ConfigError, RunConfig
from shardyard.training.data import ByteDataset, DatasetError
from shardyard.training.lease import start_watchdog
from shardyard.training.model import CheckpointError, TinyGPT, load_pretrained, save_pretrained
from shardyard.training.pacing import SyncPacer
from shardyard.training.preemption import CHECKPOINT_SUBDIR, StopFlag
from shardyard.training.progress import ProgressReporter
from shardyard.training.sync import ParamSync, SyncStats

_PREFIX = "shardyard.training"
SERVICE = "shardyard-shard"
"""``service.name`` of a shard process's spans (``shard``, ``rendezvous``, one ``sync`` per parameter sync)."""


class UserError(Exception):
    """A problem with what the user supplied (config, checkpoint, dataset): exit USER_ERROR."""


class CommError(Exception):
    """A torch.distributed failure: exit COMM_ERROR."""


class SyncTimeoutError(CommError):
    """A parameter sync did not complete within its timeout: exit SYNC_TIMEOUT."""


class Terminated(Exception):
    """The agent asked this shard to end now (SIGTERM: revoked, fenced, or the agent shuts down)."""


TERMINATED_EXIT = 128 + signal.SIGTERM
"""The exit status of a shard that ended on SIGTERM, as if the signal had killed it (the agent's cause: KILLED)."""


class TermFlag:
    """Raised by SIGTERM; the training loop reads it between steps, so the shard ends with its state consistent."""

    def __init__(self) -> None:
        self.requested = False

    @classmethod
    def install(cls) -> TermFlag:
        flag = cls()

        def handler(_signum: int, _frame: object) -> None:
            flag.requested = True

        signal.signal(signal.SIGTERM, handler)
        signal.siginterrupt(signal.SIGTERM, False)
        return flag


@contextlib.contextmanager
def _comm(what: str) -> Iterator[None]:
    """Errors raised inside are communication failures (gloo raises plain RuntimeErrors, not only DistError)."""
    try:
        yield
    except (RuntimeError, OSError, TimeoutError, ValueError) as exc:
        raise CommError(f"{what} failed: {_describe(exc)}") from exc


@contextlib.contextmanager
def _sync_comm(what: str, timeout_s: float) -> Iterator[None]:
    """Like :func:`_comm`, but a failure that is a timeout is a :class:`SyncTimeoutError`."""
    t0 = time.monotonic()
    try:
        yield
    except (RuntimeError, OSError, TimeoutError, ValueError) as exc:
        elapsed = time.monotonic() - t0
        if exitcodes.is_sync_timeout(str(exc), elapsed, timeout_s):
            raise SyncTimeoutError(f"{what} timed out after {elapsed:.1f} s: {_describe(exc)}") from exc
        raise CommError(f"{what} failed: {_describe(exc)}") from exc


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split()) or type(exc).__name__}"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _load_inputs(cfg: RunConfig) -> tuple[TinyGPT, ByteDataset, Checkpoint | None]:
    """The model (from the resume checkpoint when there is one, else the pretrained one) and the dataset."""
    try:
        resumed = None if cfg.resume_dir is None else load_checkpoint(cfg.resume_dir, rank=cfg.rank)
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


def _init_process_group(cfg: RunConfig) -> dist.ProcessGroup:
    """The default group (rendezvous, barriers: ``dist_timeout_s``) and the group the parameter syncs use, whose
    collectives time out after ``sync_timeout_s``."""
    os.environ.update(MASTER_ADDR=cfg.master_addr, MASTER_PORT=str(cfg.master_port))
    with _comm(f"init_process_group(gloo, {cfg.master_addr}:{cfg.master_port}, world_size={cfg.world_size})"):
        dist.init_process_group(
            "gloo",
            init_method="env://",
            rank=cfg.rank,
            world_size=cfg.world_size,
            timeout=timedelta(seconds=cfg.dist_timeout_s),
        )
        group = dist.new_group(timeout=timedelta(seconds=cfg.sync_timeout_s))
    assert group is not None  # every rank is a member
    return group


@dataclass(frozen=True)
class Outcome:
    steps: int
    """The last step completed: ``max_steps``, or the step the gang stopped at."""
    loss: float
    preempted: bool


class _Checkpoints:
    """Rank 0's checkpoints: periodic ones written in the background, the preemption one waited for."""

    def __init__(self, cfg: RunConfig, reporter: ProgressReporter) -> None:
        self.cfg = cfg
        self.reporter = reporter
        self.directory = cfg.output_dir / CHECKPOINT_SUBDIR
        self.writer = CheckpointWriter(self.directory, self._written) if cfg.rank == 0 else None
        self._snapshot_ms: dict[int, float] = {}

    def due(self, syncs: int) -> bool:
        return self.cfg.checkpoint_every > 0 and syncs % self.cfg.checkpoint_every == 0

    def _ranks(self, optimizer: torch.optim.Optimizer) -> dict[int, bytes]:
        """Every rank's optimizer state, gathered on rank 0 (a collective: every rank calls it at the same sync)."""
        if self.cfg.world_size == 1:
            return {}
        mine = optimizer_bytes(optimizer)
        gathered: list[object] | None = [None] * self.cfg.world_size if self.cfg.rank == 0 else None
        with _comm("optimizer state gather"):
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


class _Syncs:
    """The gang's parameter syncs: when they are due, the AllReduce (timed out) and the pace."""

    def __init__(self, cfg: RunConfig, model: TinyGPT, group: dist.ProcessGroup, start: int) -> None:
        self.cfg = cfg
        self.sync = ParamSync(list(model.parameters()), group=group)
        self.pacer = SyncPacer(base_interval=cfg.sync_interval, factor=cfg.slow_sync_factor)
        self.stats = SyncStats(ms=0.0, bytes=0, buckets=0)
        self.count = 0
        self.next_sync = start + self.pacer.interval

    def due(self, step: int) -> bool:
        return step >= self.next_sync or step == self.cfg.max_steps  # always end on a sync

    def run(self, step: int, *, stop: bool) -> bool:
        """Average the parameters at ``step``; True when the gang agreed to stop here."""
        last = step == self.cfg.max_steps
        with tracing.span("sync", {"shardyard.step": step, "shardyard.sync": self.count + 1}) as span:
            with _sync_comm(f"parameter AllReduce at step {step}", self.cfg.sync_timeout_s):
                # At the last step the run is complete: finishing beats checkpointing.
                self.stats = self.sync.allreduce_mean(stop=stop and not last, slow=self.pacer.vote)
            span.set_attribute("shardyard.allreduce_bytes", self.stats.bytes)
        self.count += 1
        previous = self.pacer.interval
        if self.pacer.observe(self.stats.ms, agreed_slow=self.stats.slow) is not None:
            print(
                f"{_PREFIX}[rank {self.cfg.rank}]: {self.pacer.slow_syncs} slow syncs, the last {self.stats.ms:.1f} ms;"
                f" sync interval {previous} -> {self.pacer.interval} steps from step {step}",
                file=sys.stderr,
            )
        self.next_sync = step + self.pacer.interval
        return self.stats.stop


def _agree_on_start(cfg: RunConfig, start: int) -> None:
    """Every rank resumed from the same step. A rank that read the checkpoint while the rank 0 of the broken gang was
    still putting a later one in place can differ: the gang then fails (and is retried) instead of diverging."""
    if cfg.world_size == 1:
        return
    starts: list[object] = [None] * cfg.world_size
    with _comm("start step all_gather"):
        dist.all_gather_object(starts, start)
    if len(set(starts)) > 1:
        raise CommError(f"the ranks resumed from different steps {starts}: the checkpoint changed while they read it")


def train(cfg: RunConfig, reporter: ProgressReporter, stop: StopFlag, term: TermFlag | None = None) -> Outcome:
    """Load (or resume), train to ``max_steps`` with periodic parameter averaging and save on rank 0.

    After every ``checkpoint_every`` syncs rank 0 checkpoints the gang to ``<output>/checkpoint``. When ``stop`` is
    raised on any rank, the gang stops at its next sync before ``max_steps``: rank 0 writes a checkpoint there and
    every rank reports ``preempted`` at that step. Slow syncs widen the sync interval (:mod:`.pacing`). ``term``
    (SIGTERM) ends the run between two steps.
    """
    _check_progress_fd(cfg.progress_fd)
    torch.set_num_threads(1)
    seed_everything(cfg.seed)
    model, dataset, resumed = _load_inputs(cfg)  # before the rendezvous: bad input fails fast, not after a timeout
    start = 0 if resumed is None else resumed.state.step
    if resumed is not None:
        print(f"{_PREFIX}[rank {cfg.rank}]: resuming from {cfg.resume_dir} at step {start}", file=sys.stderr)
    with tracing.span("rendezvous", {"shardyard.master": f"{cfg.master_addr}:{cfg.master_port}"}):
        group = _init_process_group(cfg)
        _agree_on_start(cfg, start)
    syncs = _Syncs(cfg, model, group, start)
    reporter.started(world_size=cfg.world_size, rank=cfg.rank)

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    if resumed is not None and resumed.optimizer is not None:
        _restore_optimizer(optimizer, resumed.optimizer, cfg.lr)
    stream = dataset.batches(cfg.rank, cfg.world_size, cfg.batch_size, cfg.seq_len, cfg.seed, start_step=start)
    loss_value = float("nan") if resumed is None or resumed.state.loss is None else resumed.state.loss
    step, stopped = start, False
    checkpoints = _Checkpoints(cfg, reporter)
    try:
        for step in range(start + 1, cfg.max_steps + 1):
            if term is not None and term.requested:
                raise Terminated(f"terminated after step {step - 1}")
            inputs, targets = next(stream)
            logits = model(inputs)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
            optimizer.zero_grad(set_to_none=True)
            torch.autograd.backward(loss)
            optimizer.step()
            loss_value = float(loss.item())
            is_sync = syncs.due(step)
            if is_sync:
                stopped = syncs.run(step, stop=stop.requested)
                if not stopped and step < cfg.max_steps and checkpoints.due(syncs.count):
                    checkpoints.submit(step, loss_value, model, optimizer)  # the weights just averaged
            reporter.progress(
                step=step,
                loss=loss_value,
                samples=(step - start) * cfg.batch_size,
                allreduce_ms=syncs.stats.ms,
                allreduce_bytes=syncs.stats.bytes,
                syncs=syncs.count,
                sync_interval=syncs.pacer.interval,
                slow_syncs=syncs.pacer.slow_syncs,
                force=is_sync,
            )
            if stopped:
                checkpoints.write_now(step, loss_value, model, optimizer)
                break
    finally:
        checkpoints.close()

    if stopped:
        with _comm("checkpoint barrier"):  # nobody reports before the checkpoint is complete
            dist.barrier()
        dist.destroy_process_group()
        reporter.preempted(step=step, checkpoint_dir=checkpoints.directory if cfg.rank == 0 else None)
        return Outcome(steps=step, loss=loss_value, preempted=True)

    if cfg.rank == 0:
        _save_final(model, cfg.output_dir)
    with _comm("final barrier"):
        dist.barrier()
    dist.destroy_process_group()
    checkpoint_dir = cfg.output_dir if cfg.rank == 0 else None
    reporter.finished(final_loss=loss_value, steps=cfg.max_steps, checkpoint_dir=checkpoint_dir)
    return Outcome(steps=cfg.max_steps, loss=loss_value, preempted=False)


def _save_final(model: TinyGPT, output_dir: Path) -> None:
    """The final model replaces the output directory, and the last checkpoint is carried into the new one. A gang can
    be re-formed after this shard finished (its agent was paused or cut off before the end reached the bus, and the
    node was suspected): the new attempt then resumes from that checkpoint instead of failing on a missing one."""
    checkpoint = output_dir / CHECKPOINT_SUBDIR
    parked = output_dir.with_name(f".{output_dir.name}.{CHECKPOINT_SUBDIR}-{os.getpid()}")
    carried = checkpoint.is_dir()
    if carried:
        os.replace(checkpoint, parked)
    try:
        save_pretrained(model, output_dir)  # replaces the output directory atomically
    finally:
        if carried:
            os.replace(parked, output_dir / CHECKPOINT_SUBDIR)


def main(env: Mapping[str, str] | None = None, stop: StopFlag | None = None, *, watch_lease: bool = True) -> int:
    stop = StopFlag.install() if stop is None else stop  # first: a stop request must never kill the shard
    term = TermFlag.install() if env is None else None
    try:
        cfg = RunConfig.from_env(os.environ if env is None else env)
    except ConfigError as exc:
        print(f"{_PREFIX}: {exc}", file=sys.stderr)
        return exitcodes.USER_ERROR
    where = f"{_PREFIX}[rank {cfg.rank}/{cfg.world_size}]"
    source = os.environ if env is None else env
    start_watchdog(source)  # stop at once if the agent goes silent
    reporter = ProgressReporter(cfg.progress_fd)
    # The shard continues its job's trace from the agent's launch span (TRACEPARENT); the provider flushes at exit.
    tracing.configure(SERVICE, source, instance=f"{source.get('SHARDYARD_JOB_ID', '')}/rank-{cfg.rank}")
    shard: tracing.Attributes = {"shardyard.job_id": source.get("SHARDYARD_JOB_ID", ""), "shardyard.rank": cfg.rank}
    try:
        with tracing.span("shard", shard, parent=tracing.extract(tracing.from_env(source))):
            outcome = train(cfg, reporter, stop, term)
    except UserError as exc:
        print(f"{where}: user error: {exc}", file=sys.stderr)
        return exitcodes.USER_ERROR
    except Terminated as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        return TERMINATED_EXIT
    except Exception as exc:
        return _failure(where, exc)
    finally:
        reporter.close()
    if outcome.preempted:
        print(f"{where}: preempted at step {outcome.steps}", file=sys.stderr)
        return exitcodes.PREEMPTED
    return exitcodes.OK


def _failure(where: str, exc: Exception) -> int:
    """The exit code of a run that raised ``exc``, its reason on stderr: out of memory and GPU faults first (they
    may surface inside a collective), then timed-out syncs and other communication errors, else an internal error."""
    fault = exitcodes.fault_exit_code(exc)
    if fault == exitcodes.OOM:
        print(f"{where}: out of memory: {_describe(exc)}", file=sys.stderr)
    elif fault == exitcodes.GPU_FAULT:
        print(f"{where}: GPU fault: {_describe(exc)}", file=sys.stderr)
    elif isinstance(exc, SyncTimeoutError):
        print(f"{where}: sync timeout: {exc}", file=sys.stderr)
        return exitcodes.SYNC_TIMEOUT
    elif isinstance(exc, CommError):
        print(f"{where}: communication error: {exc}", file=sys.stderr)
        return exitcodes.COMM_ERROR
    else:
        print(f"{where}: internal error:\n{traceback.format_exc()}", file=sys.stderr)
        return exitcodes.INTERNAL_ERROR
    return fault


if __name__ == "__main__":
    sys.exit(main())
