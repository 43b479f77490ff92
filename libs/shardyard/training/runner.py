"""Entry point of one training shard: ``python -m shardyard.training.runner`` (torchrun-style environment).

Exit codes are those of :mod:`shardyard.training.exitcodes`: OK, USER_ERROR (bad config, model, dataset or resume
checkpoint), COMM_ERROR (torch.distributed init/AllReduce/barrier failures), SYNC_TIMEOUT (a sync past
``SHARDYARD_SYNC_TIMEOUT_S``), OOM and GPU_FAULT (out of memory; a CUDA error that points at the device, or the GPU
``LOCAL_RANK`` names is not there), PREEMPTED (stopped on request after checkpointing, see
:mod:`shardyard.training.preemption`), INTERNAL_ERROR (anything else); see :mod:`shardyard.training.errors`.

With ``SHARDYARD_SYNC_INTERVAL`` 1 the gang averages gradients at every step (synchronous data parallelism), above
1 it averages parameters every that many steps (local SGD): :mod:`shardyard.training.gang_sync`. It trains on
``cuda:LOCAL_RANK`` over NCCL when CUDA is present, else on the CPU over gloo: :mod:`shardyard.training.rendezvous`.

Rank 0 checkpoints the gang periodically to ``<output>/checkpoint`` (in the background,
:mod:`shardyard.training.gang_checkpoints`), so a gang that fails resumes having lost at most the steps since the
last one. SIGTERM (the agent revokes the shard when its gang is re-formed) ends the shard between two steps, after
the checkpoint being written is in place: a surviving rank 0 always leaves the gang's last checkpoint behind.

Every rank also keeps the gang's state of its last sync in memory and writes it on its node when it fails; a
re-formed gang resumes from its surviving peers' state when that is later than the checkpoint
(:mod:`shardyard.training.peer_state`), so a failure loses at most the steps since the last sync, however seldom the
gang checkpoints.

The checkpoint holds every rank's optimizer state at the sync, so a gang resumed from it continues exactly as it would
have without the fault. A checkpoint of a survivor's own state after the sync (its local steps) would lose fewer steps
but not that: tried, it moved the final loss of the recovery test's job by 15-20 %, since the ranks resume with one
rank's optimizer moments and parameters that were never averaged.

When it finishes, each rank prints its training rate on stderr, measured from the end of its first step to the end
of its last (start-up, the rendezvous and the first step left out): ``trained steps A..B, N steps in S s after the
first: R steps/s``. ``bench/training.py`` reads it.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from shardyard import tracing
from shardyard.training import exitcodes
from shardyard.training.checkpoint import Checkpoint, load_checkpoint
from shardyard.training.config import ConfigError, RunConfig
from shardyard.training.data import ByteDataset, DatasetError
from shardyard.training.errors import (
    CommError,
    DeviceError,
    SyncTimeoutError,
    Terminated,
    UserError,
    comm,
    describe,
)
from shardyard.training.gang_checkpoints import GangCheckpoints
from shardyard.training.gang_sync import GangSync
from shardyard.training.lease import start_watchdog
from shardyard.training.model import CheckpointError, TinyGPT, load_pretrained, save_pretrained
from shardyard.training.peer_state import (
    PeerSnapshots,
    TermWatch,
    agree_on_resume,
    describe_plan,
    read_offers,
    transfer,
)
from shardyard.training.preemption import CHECKPOINT_SUBDIR, StopFlag
from shardyard.training.progress import ProgressReporter
from shardyard.training.rendezvous import init_process_group, place

__all__ = ["TERMINATED_EXIT", "CommError", "Outcome", "SyncTimeoutError", "TermFlag", "UserError", "main", "train"]

_PREFIX = "shardyard.training"
SERVICE = "shardyard-shard"
"""``service.name`` of a shard process's spans (``shard``, ``rendezvous``, one ``sync`` per parameter sync)."""

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
    if model.config.vocab_size < 256:
        raise UserError(f"the model's vocab_size={model.config.vocab_size} is below 256, the byte ids of the dataset")
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


@dataclass(frozen=True)
class Outcome:
    steps: int
    """The last step completed: ``max_steps``, or the step the gang stopped at."""
    loss: float
    preempted: bool


class _Rate:
    """The training rate from the end of the first step to the end of the last (what ``bench/training.py`` reads)."""

    def __init__(self) -> None:
        self.first: tuple[int, float] | None = None
        self.last: tuple[int, float] | None = None

    def stepped(self, step: int) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = (step, now)
        self.last = (step, now)

    def report(self, where: str) -> None:
        if self.first is None or self.last is None or self.last[0] == self.first[0]:
            return
        steps, seconds = self.last[0] - self.first[0], self.last[1] - self.first[1]
        print(
            f"{where}: trained steps {self.first[0]}..{self.last[0]}, {steps} steps in {seconds:.3f} s after the"
            f" first: {steps / seconds:.2f} steps/s",
            file=sys.stderr,
        )


def train(cfg: RunConfig, reporter: ProgressReporter, stop: StopFlag, term: TermFlag | None = None) -> Outcome:
    """Load (or resume), train to ``max_steps`` averaging gradients (``sync_interval`` 1) or parameters (every
    ``sync_interval`` steps), and save on rank 0.

    Rank 0 checkpoints the gang periodically to ``<output>/checkpoint``. When ``stop`` is raised on any rank, the
    gang stops at its next sync before ``max_steps``: rank 0 writes a checkpoint there and every rank reports
    ``preempted`` at that step. Slow syncs widen a sync interval above 1 (:mod:`.pacing`). ``term`` (SIGTERM) ends
    the run between two steps.
    """
    _check_progress_fd(cfg.progress_fd)
    torch.set_num_threads(1)
    seed_everything(cfg.seed)
    model, dataset, resumed = _load_inputs(cfg)  # before the rendezvous: bad input fails fast, not after a timeout
    placement = place(cfg)  # so does a missing GPU
    model.to(placement.device)
    start = 0 if resumed is None else resumed.state.step
    where = f"{_PREFIX}[rank {cfg.rank}/{cfg.world_size}]"
    rendezvous: tracing.Attributes = {
        "shardyard.master": f"{cfg.master_addr}:{cfg.master_port}",
        "shardyard.backend": placement.backend,
    }
    with tracing.span("rendezvous", rendezvous) as span:
        group = init_process_group(cfg, placement)
        plan = agree_on_resume(cfg, start, read_offers(cfg.peer_state_dir, cfg))
        if plan is not None:  # the survivors of the broken gang hold a later state than the checkpoint
            resumed = transfer(cfg, plan)
            model = resumed.model.to(placement.device)
            start = plan.step
            span.set_attribute("shardyard.resumed_from_peers", start)
    if plan is not None:
        print(f"{_PREFIX}[rank {cfg.rank}]: resuming from {describe_plan(plan, cfg.rank)}", file=sys.stderr)
    elif resumed is not None:
        print(f"{_PREFIX}[rank {cfg.rank}]: resuming from {cfg.resume_dir} at step {start}", file=sys.stderr)
    mode = "gradients every step" if cfg.averages_gradients else f"parameters every {cfg.sync_interval} steps"
    print(f"{where}: training on {placement.device} over {placement.backend}, averaging {mode}", file=sys.stderr)
    syncs = GangSync(cfg, model, group, start)  # on the device: a ParamSync holds the parameters from now on
    reporter.started(world_size=cfg.world_size, rank=cfg.rank)

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    if resumed is not None and resumed.optimizer is not None:
        _restore_optimizer(optimizer, resumed.optimizer, cfg.lr)
    stream = dataset.batches(cfg.rank, cfg.world_size, cfg.batch_size, cfg.seq_len, cfg.seed, start_step=start)
    loss_value = float("nan") if resumed is None or resumed.state.loss is None else resumed.state.loss
    step, stopped = start, False
    rate = _Rate()
    checkpoints = GangCheckpoints(cfg, reporter)
    peers = PeerSnapshots(cfg, group, placement.device)
    on_term = partial(peers.save_on_term, model, optimizer, exit_code=TERMINATED_EXIT)
    keeper = TermWatch(on_term) if peers.enabled else contextlib.nullcontext()
    try:
        with keeper, peers.hold():
            try:
                for step in range(start + 1, cfg.max_steps + 1):
                    if term is not None and term.requested:
                        raise Terminated(f"terminated after step {step - 1}")
                    inputs, targets = (t.to(placement.device, non_blocking=True) for t in next(stream))
                    logits = model(inputs)
                    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
                    optimizer.zero_grad(set_to_none=True)
                    torch.autograd.backward(loss)
                    with peers.waiting_on_gang():  # sync_interval 1: every rank, the same update
                        synced = syncs.gradients(step, stop=stop.requested)
                    optimizer.step()
                    loss_value = float(loss.item())
                    if synced is None:
                        with peers.waiting_on_gang():  # local SGD: every sync_interval steps
                            synced = syncs.parameters(step, stop=stop.requested)
                        if synced is False and step < cfg.max_steps:
                            peers.synced(step, loss_value, model, optimizer)
                    else:
                        peers.stepped(step, loss_value)
                    stopped = bool(synced)
                    checkpointed = synced is not None and not stopped and step < cfg.max_steps
                    checkpointed = checkpointed and checkpoints.due(step, syncs.count)
                    if checkpointed:
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
                        force=checkpointed or (synced is not None and not syncs.averages_gradients),
                    )
                    rate.stepped(step)
                    if stopped:
                        checkpoints.write_now(step, loss_value, model, optimizer)
                        break
            except BaseException:
                if peers.enabled and (where_kept := peers.save(model, optimizer)) is not None:
                    print(f"{where}: kept the gang's state of step {peers.step} in {where_kept}", file=sys.stderr)
                raise
    finally:
        checkpoints.close()
    rate.report(where)

    if stopped:
        with comm("checkpoint barrier"):  # nobody reports before the checkpoint is complete
            dist.barrier()
        dist.destroy_process_group()
        reporter.preempted(step=step, checkpoint_dir=checkpoints.directory if cfg.rank == 0 else None)
        return Outcome(steps=step, loss=loss_value, preempted=True)

    if cfg.rank == 0:
        _save_final(model, cfg.output_dir)
    with comm("final barrier"):
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
        return _failed(exitcodes.USER_ERROR, reporter, in_process=env is not None)
    except Terminated as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        reporter.close()
        _exit_now(TERMINATED_EXIT)
    except Exception as exc:
        return _failed(_failure(where, exc), reporter, in_process=env is not None)
    finally:
        reporter.close()
    if outcome.preempted:
        print(f"{where}: preempted at step {outcome.steps}", file=sys.stderr)
        return exitcodes.PREEMPTED
    return exitcodes.OK


def _failed(code: int, reporter: ProgressReporter, *, in_process: bool) -> int:
    """A failed run's exit: at once (:func:`_exit_now`) in a shard's own process. A process group left behind by a
    failed collective is torn down at the interpreter's exit, and gloo's can abort the process there ("terminate
    called without an active exception", seen after a peer's death): the shard would then die by SIGABRT, a KILLED
    shard to its agent instead of the COMM_ERROR it printed, and a KILLED shard is a culprit that a recovery plan
    does not wait on. Run in-process (tests), the code is returned."""
    if in_process:
        return code
    reporter.close()
    _exit_now(code)


def _exit_now(code: int) -> NoReturn:
    """End the process without the interpreter's shutdown: with its gang's peers still in a collective, the process
    group's teardown at exit can wait on them indefinitely (seen with gloo), and a shard told to end must end. Spans
    and output are flushed first."""
    tracing.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _failure(where: str, exc: Exception) -> int:
    """The exit code of a run that raised ``exc``, its reason on stderr: out of memory and GPU faults first (they
    may surface inside a collective), then timed-out syncs and other communication errors, else an internal error."""
    fault = exitcodes.GPU_FAULT if isinstance(exc, DeviceError) else exitcodes.fault_exit_code(exc)
    if fault == exitcodes.OOM:
        print(f"{where}: out of memory: {describe(exc)}", file=sys.stderr)
    elif fault == exitcodes.GPU_FAULT:
        print(f"{where}: GPU fault: {describe(exc)}", file=sys.stderr)
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
