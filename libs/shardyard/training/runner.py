"""Entry point of one training shard: ``python -m shardyard.training.runner`` (torchrun-style environment).

Exit codes are those of :mod:`shardyard.training.exitcodes`: OK, USER_ERROR (bad config, model, dataset or resume
checkpoint), COMM_ERROR (torch.distributed init/AllReduce/barrier failures), SYNC_TIMEOUT (a sync past
``SHARDYARD_SYNC_TIMEOUT_S``), OOM and GPU_FAULT (out of memory; a CUDA error that points at the device, or the GPU
``LOCAL_RANK`` names is not there), DISK_FULL and IO_ERROR (a checkpoint or the final model could not be written:
no space, or the disk failed; :mod:`shardyard.training.storage`), PREEMPTED (stopped on request after checkpointing, see
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
import traceback
from collections.abc import Mapping
from typing import NoReturn

import numpy as np
import torch

from shardyard import tracing
from shardyard.training import exitcodes, storage
from shardyard.training import notice as notice_stop
from shardyard.training.config import ConfigError, RunConfig
from shardyard.training.errors import (
    CommError,
    DeviceError,
    SyncTimeoutError,
    Terminated,
    UserError,
    describe,
)
from shardyard.training.gang_sync import GangSync
from shardyard.training.lease import start_watchdog
from shardyard.training.preemption import StopFlag
from shardyard.training.progress import ProgressReporter
from shardyard.training.steps import PREFIX, Outcome, Steps, finish, join_gang
from shardyard.training.storage import StorageFault, fault_of, free_space, path_of

__all__ = ["TERMINATED_EXIT", "CommError", "Outcome", "SyncTimeoutError", "TermFlag", "UserError", "main", "train"]

_PREFIX = PREFIX
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


def _check_progress_fd(fd: int | None) -> None:
    if fd is None:
        return
    try:
        os.fstat(fd)
    except OSError as exc:
        raise UserError(f"SHARDYARD_PROGRESS_FD={fd} is not an open file descriptor ({exc.strerror})") from exc


def train(cfg: RunConfig, reporter: ProgressReporter, stop: StopFlag, term: TermFlag | None = None) -> Outcome:
    """Load (or resume), train to ``max_steps`` averaging gradients (``sync_interval`` 1) or parameters (every
    ``sync_interval`` steps), and save on rank 0.

    Rank 0 checkpoints the gang periodically to ``<output>/checkpoint``. When ``stop`` is raised (a notice), the
    gang stops before ``max_steps``: at its next sync, or with local SGD as soon as the ranks that have the notice
    agree on a step between two syncs (:mod:`shardyard.training.notice`); rank 0 writes a checkpoint there and every
    rank reports ``preempted`` at that step. Slow syncs widen a sync interval above 1 (:mod:`.pacing`). ``term``
    (SIGTERM) ends the run between two steps. The steps are :mod:`shardyard.training.steps`.
    """
    _check_progress_fd(cfg.progress_fd)
    torch.set_num_threads(1)
    seed_everything(cfg.seed)
    where = f"{_PREFIX}[rank {cfg.rank}/{cfg.world_size}]"
    gang = join_gang(cfg, where)
    prefix = f"{notice_stop.PREFIX}/{cfg.attempt}"
    notice = notice_stop.NoticeStop(gang.store, cfg.world_size, timeout_s=cfg.sync_timeout_s, prefix=prefix)
    syncs = GangSync(cfg, gang.model, gang.group, gang.start, notice)  # on the device: it holds the parameters now
    reporter.started(world_size=cfg.world_size, rank=cfg.rank)
    steps = Steps(cfg, gang, syncs, reporter, terminated_exit=TERMINATED_EXIT)
    try:
        with steps.keeper, steps.peers.hold():
            try:
                for step in range(gang.start + 1, cfg.max_steps + 1):
                    if term is not None and term.requested:
                        raise Terminated(f"terminated after step {step - 1}")
                    if steps.step(step, stop) or steps.stop_on_notice(step, stop):
                        break
            except BaseException:
                steps.report_last()
                steps.keep_state(where)
                raise
    finally:
        steps.checkpoints.close()
    steps.rate.report(where)
    return finish(cfg, steps, reporter)


def main(env: Mapping[str, str] | None = None, stop: StopFlag | None = None, *, watch_lease: bool = True) -> int:
    """Run one shard and return its exit code; in a shard's own process (``env`` None) it never returns: every end,
    a finished run's included, is :func:`_exit_now`. A process group torn down at the interpreter's exit can abort
    the process there, after the run succeeded ("terminate called without an active exception", seen with gloo on a
    rank of a re-formed gang), and a finished shard would then die by SIGABRT, a KILLED shard to its agent."""
    del watch_lease  # the lease watchdog starts once, whoever asks first (``shardyard.training.shard`` does)
    code = _run(env, stop)
    if env is not None:
        return code
    _exit_now(code)


def _run(env: Mapping[str, str] | None, stop: StopFlag | None) -> int:
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
        reporter.close()
        _exit_now(TERMINATED_EXIT)
    except Exception as exc:
        return _failure(where, exc, reporter)
    finally:
        reporter.close()
    if outcome.preempted:
        print(f"{where}: preempted at step {outcome.steps}", file=sys.stderr)
        return exitcodes.PREEMPTED
    return exitcodes.OK


def _exit_now(code: int) -> NoReturn:
    """End the process without the interpreter's shutdown: with its gang's peers still in a collective, the process
    group's teardown at exit can wait on them indefinitely (seen with gloo), and a shard told to end must end. Spans
    and output are flushed first."""
    tracing.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # a log on a full disk must not turn the exit code into a traceback's 1
            stream.flush()
    os._exit(code)


def _failure(where: str, exc: Exception, reporter: ProgressReporter) -> int:
    """The exit code of a run that raised ``exc``, its reason on stderr: out of memory and GPU faults first (they
    may surface inside a collective), then a full or failing disk, then timed-out syncs and other communication
    errors, else an internal error."""
    fault = exitcodes.GPU_FAULT if isinstance(exc, DeviceError) else exitcodes.fault_exit_code(exc)
    disk = None if fault is not None or isinstance(exc, CommError) else fault_of(exc)  # a socket's EIO is comm's
    if disk is not None:
        return _storage_failure(where, *disk, reporter)
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


def _storage_failure(where: str, fault: StorageFault, error: OSError, reporter: ProgressReporter) -> int:
    """A write or read that a full or failing disk refused: DISK_FULL or IO_ERROR, told to the agent with the path
    and the space left there over the progress pipe (the log may be on the disk that filled)."""
    path = path_of(error)
    message = storage.describe(fault, error, path, None if path is None else free_space(path))
    reporter.failed(fault.value, message)
    with contextlib.suppress(OSError):
        print(f"{where}: {message}", file=sys.stderr)
    return exitcodes.DISK_FULL if fault is StorageFault.DISK_FULL else exitcodes.IO_ERROR


if __name__ == "__main__":
    sys.exit(main())
