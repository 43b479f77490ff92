"""``shardyard.train``: an optional client for a user's own training script run by Shardyard (a job's ``entrypoint``).

A plain ``torch.distributed`` script runs unmodified. Importing this module adds what the runtime offers the built-in
runner: progress in the monitor, periodic parameter averaging, checkpoints that recovery and preemption resume from,
and the preemption stop request. Outside Shardyard (``torchrun``, ``python`` by hand) every function is a harmless
no-op: nothing is reported, nothing is saved, ``restore()`` finds nothing, no stop is ever requested. Torch is
imported only by the functions that need it::

    import sys
    from shardyard import train

    restored = train.restore()                       # (state, step) after a preemption or a failure, else None
    start = 0 if restored is None else restored[1]   # ... and load restored[0] into the model and optimizer
    for step in range(start + 1, steps + 1):
        ...                                          # forward, backward, optimizer step
        if train.sync_due(step):                     # every SHARDYARD_SYNC_INTERVAL steps
            stats = train.average_parameters(model)  # a collective: every rank calls it at the same step
            train.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step)
            if stats.stop:                           # the gang agreed to stop (preemption): checkpointed above
                sys.exit(train.preempted(step))
        train.report(step, loss.item(), samples=batch_size)

A preemption comes as a notice (the signal ``SHARDYARD_NOTICE_SIGNAL`` names): the gang has ``SHARDYARD_NOTICE_S``
seconds (:func:`notice_s`; :func:`notice_left` counts them down) to save and exit :data:`PREEMPTED` before it is
killed. To stop at once rather than at the next sync, a script asks the gang at every step (a collective of two
numbers)::

        if train.stop_agreed():                      # every rank, every step: any rank noticed?
            train.save(state, step)
            sys.exit(train.preempted(step))

A script ends with exit status 0 (done), :data:`PREEMPTED` (stopped on request, after saving) or :data:`USER_ERROR`
(bad input or configuration: not retried); any other status is a failure the runtime retries (see
:mod:`shardyard.training.entry`). The environment the script gets is described there and in docs/users/own-script.md.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from shardyard.training import exitcodes
from shardyard.training.entry import CHECKPOINT_DIR_ENV, PROGRESS_FD_ENV, SYNC_INTERVAL_ENV
from shardyard.training.preemption import NOTICE_S_ENV, RESUME_DIR_ENV, StopFlag
from shardyard.training.progress import ProgressReporter

if TYPE_CHECKING:
    import torch

    from shardyard.training.sync import ParamSync, SyncStats

__all__ = [
    "PREEMPTED",
    "USER_ERROR",
    "Runtime",
    "average_parameters",
    "checkpoint_dir",
    "notice_left",
    "notice_s",
    "preempted",
    "report",
    "restore",
    "save",
    "stop_agreed",
    "stop_requested",
    "sync_due",
]

USER_ERROR: Final = exitcodes.USER_ERROR
"""Exit with this when the job's input or configuration is wrong: the shard fails USER_ERROR, and is not retried."""
PREEMPTED: Final = exitcodes.PREEMPTED
"""Exit with this (``sys.exit(train.preempted(step))``) after saving, when the gang agreed to stop."""
STATE_FILE: Final = "state.pt"
META_FILE: Final = "shardyard-train.json"
"""``{"format": ..., "step": S}``: what makes a directory a checkpoint of this client."""
FORMAT: Final = "shardyard.train/1"


class Runtime:
    """One script's view of the runtime, from its environment; the module's functions use one for ``os.environ``."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.rank = _int(env.get("RANK")) or 0
        interval = _int(env.get(SYNC_INTERVAL_ENV))
        self.sync_interval = interval if interval is not None and interval > 0 else None
        self.reporter = ProgressReporter(_open_fd(env.get(PROGRESS_FD_ENV)))
        self.stop_flag: StopFlag | None = None
        self.syncs: dict[tuple[int, ...], ParamSync] = {}
        self.flags: ParamSync | None = None
        """What :meth:`stop_agreed` reduces: the stop flag alone."""
        self.last_sync: SyncStats | None = None
        self.sync_count = 0
        self.samples = 0
        self.last: tuple[int, float] | None = None
        """(step, loss) of the last report: what the script's end reports as its final loss."""
        self.unsent = False
        """Whether the last report was folded into a later line that has not been written yet."""
        self.ended = False
        self._lock = threading.Lock()
        if self.reporter.enabled:
            atexit.register(self.finish)

    # --- progress --------------------------------------------------------------------------------------------
    def report(self, step: int, loss: float, samples: int | None = None) -> None:
        """``samples``: samples this rank processed since its previous report (its batch size, reported each step).
        Lines are written at most once a second, and at every sync step."""
        self.stop_requested()  # take the stop signal early: a request pending since the start is seen
        if not self.reporter.enabled:
            return
        with self._lock:
            self.samples += samples or 0
            self.last = (step, float(loss))
            self._line(step, float(loss), force=self.sync_due(step))

    def _line(self, step: int, loss: float, *, force: bool) -> None:
        stats = self.last_sync
        written = self.reporter.progress(
            step=step,
            loss=loss,
            samples=self.samples,
            allreduce_ms=0.0 if stats is None else stats.ms,
            allreduce_bytes=0 if stats is None else stats.bytes,
            syncs=self.sync_count,
            force=force,
        )
        self.unsent = not written

    def finish(self) -> None:
        """Report the end with the last reported loss (at exit; the runtime uses it when the script exits 0). A last
        step still folded is written first, so the monitor sees where the script ended."""
        with self._lock:
            if self.ended:
                return
            self.ended = True
            if self.last is not None:
                step, loss = self.last
                if self.unsent:  # its loss counts twice in that line's mean: a small price for the right step
                    self._line(step, loss, force=True)
                self.reporter.finished(final_loss=loss, steps=step, checkpoint_dir=None)
            self.reporter.close()

    # --- parameter sync ----------------------------------------------------------------------------------------
    def sync_due(self, step: int) -> bool:
        self.stop_requested()
        return self.sync_interval is not None and step > 0 and step % self.sync_interval == 0

    def average_parameters(self, model_or_params: torch.nn.Module | Iterable[torch.nn.Parameter]) -> SyncStats:
        """Replace every parameter by its mean over the gang (a collective: every rank calls it at the same step);
        the result's ``stop`` is the gang's agreed answer to "was a stop requested?". With no process group (or
        one rank) nothing is sent and ``stop`` is this rank's own answer."""
        import torch

        from shardyard.training.sync import ParamSync

        params = list(model_or_params.parameters() if isinstance(model_or_params, torch.nn.Module) else model_or_params)
        key = tuple(id(p) for p in params)
        sync = self.syncs.get(key)
        if sync is None:
            sync = self.syncs[key] = ParamSync(params)
        stats = sync.allreduce_mean(stop=self.stop_requested())
        with self._lock:
            self.last_sync = stats
            self.sync_count += 1
        return stats

    # --- checkpoints -------------------------------------------------------------------------------------------
    def checkpoint_dir(self) -> Path | None:
        raw = self.env.get(CHECKPOINT_DIR_ENV)
        return Path(raw) if raw else None

    def save(self, state: Mapping[str, Any], step: int) -> Path | None:
        """Rank 0 writes ``state`` (``torch.save``-able: tensors, state dicts, numbers) as the job's checkpoint at
        ``step``, replacing the previous one atomically, and reports it; the runtime resumes the job from it. Other
        ranks, and a script not run by Shardyard, write nothing (None)."""
        directory = self.checkpoint_dir()
        if directory is None or self.rank != 0:
            return None
        import torch

        from shardyard.training.model import recover_leftovers, write_dir_atomic

        t0 = time.perf_counter()
        buffer = io.BytesIO()
        torch.save(dict(state), buffer)
        meta = json.dumps({"format": FORMAT, "step": step}).encode()
        t1 = time.perf_counter()
        recover_leftovers(directory)
        write_dir_atomic(directory, {STATE_FILE: buffer.getvalue(), META_FILE: meta})
        t2 = time.perf_counter()
        with self._lock:
            self.reporter.checkpointed(step, directory, snapshot_ms=(t1 - t0) * 1e3, write_ms=(t2 - t1) * 1e3)
        return directory

    def restore(self, map_location: str = "cpu") -> tuple[dict[str, Any], int] | None:
        """``(state, step)`` of the checkpoint the job resumes from (``SHARDYARD_RESUME_DIR``, else the job's
        checkpoint directory), or None when there is none. Loaded with ``torch.load(weights_only=True)``."""
        for raw in (self.env.get(RESUME_DIR_ENV), self.env.get(CHECKPOINT_DIR_ENV)):
            if not raw or not (Path(raw) / META_FILE).is_file():
                continue
            import torch

            meta = json.loads((Path(raw) / META_FILE).read_text())
            if meta.get("format") != FORMAT or not isinstance(meta.get("step"), int):
                raise ValueError(f"{raw}/{META_FILE} is not a {FORMAT} checkpoint: {meta}")
            state = torch.load(Path(raw) / STATE_FILE, map_location=map_location, weights_only=True)
            return dict(state), int(meta["step"])
        return None

    # --- preemption --------------------------------------------------------------------------------------------
    def stop_requested(self) -> bool:
        """Whether the runtime asked this shard to stop (preemption). Ranks may see it at different steps: stop
        where :meth:`average_parameters` says the gang agreed. The stop signal is taken (from the main thread) at
        the first call of this or of ``report``/``sync_due``; until then it stays pending."""
        if self.stop_flag is None and self.reporter.enabled and threading.current_thread() is threading.main_thread():
            self.stop_flag = StopFlag.install()
        return self.stop_flag is not None and self.stop_flag.requested

    def stop_agreed(self) -> bool:
        """Whether any rank of the gang has the notice: a collective of two numbers (every rank calls it at the same
        step; cheap enough for every step), so every rank gets the same answer at the same step. With no process
        group (or one rank), this rank's own :meth:`stop_requested`."""
        from shardyard.training.sync import ParamSync

        if self.flags is None:
            self.flags = ParamSync([])  # no parameters: only the control slots travel
        return self.flags.allreduce_mean(stop=self.stop_requested()).stop

    def notice_s(self) -> float | None:
        """The seconds a notice gives the gang to stop (``SHARDYARD_NOTICE_S``); None outside Shardyard."""
        raw = self.env.get(NOTICE_S_ENV)
        try:
            return None if raw is None else float(raw)
        except ValueError:
            return None

    def notice_left(self) -> float | None:
        """Seconds left, from this rank's notice, before the gang is killed (may be negative); None before a
        notice, or outside Shardyard."""
        given = self.notice_s()
        self.stop_requested()
        at = None if self.stop_flag is None else self.stop_flag.at
        return None if given is None or at is None else given - (time.monotonic() - at)

    def preempted(self, step: int) -> int:
        """Report that this rank stopped on request at ``step`` (after :meth:`save`); returns :data:`PREEMPTED`."""
        with self._lock:
            self.ended = True
            self.reporter.preempted(step=step, checkpoint_dir=self.checkpoint_dir() if self.rank == 0 else None)
            self.reporter.close()
        return PREEMPTED


def _int(raw: str | None) -> int | None:
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None


def _open_fd(raw: str | None) -> int | None:
    fd = _int(raw)
    if fd is None or fd < 0:
        return None
    try:
        os.fstat(fd)
    except OSError:
        return None
    return fd


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def runtime() -> Runtime:
    """The process's :class:`Runtime`, from ``os.environ`` at first use."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = Runtime(os.environ)
        return _runtime


def report(step: int, loss: float, samples: int | None = None) -> None:
    """Report a training step (at most one line a second reaches the agent; ``loss`` is averaged over the steps
    in between). ``samples``: how many samples this rank processed since its previous report."""
    runtime().report(step, loss, samples)


def sync_due(step: int) -> bool:
    """Whether ``step`` is a parameter-sync step: every ``SHARDYARD_SYNC_INTERVAL`` (the job's ``sync_interval``)."""
    return runtime().sync_due(step)


def average_parameters(model_or_params: torch.nn.Module | Iterable[torch.nn.Parameter]) -> SyncStats:
    """Average the parameters over the gang (see :meth:`Runtime.average_parameters`)."""
    return runtime().average_parameters(model_or_params)


def checkpoint_dir() -> Path | None:
    """The job's checkpoint directory (``SHARDYARD_CHECKPOINT_DIR``); None outside Shardyard."""
    return runtime().checkpoint_dir()


def save(state: Mapping[str, Any], step: int) -> Path | None:
    """Checkpoint ``state`` at ``step`` (rank 0 writes, atomically; see :meth:`Runtime.save`)."""
    return runtime().save(state, step)


def restore(map_location: str = "cpu") -> tuple[dict[str, Any], int] | None:
    """The checkpoint to resume from as ``(state, step)``, or None (see :meth:`Runtime.restore`)."""
    return runtime().restore(map_location)


def stop_requested() -> bool:
    """Whether the runtime asked this shard to stop (see :meth:`Runtime.stop_requested`)."""
    return runtime().stop_requested()


def preempted(step: int) -> int:
    """Report the stop at ``step`` and return the exit status to leave with: ``sys.exit(train.preempted(step))``."""
    return runtime().preempted(step)


def stop_agreed() -> bool:
    """Whether any rank has the notice: the same answer on every rank (a collective; :meth:`Runtime.stop_agreed`)."""
    return runtime().stop_agreed()


def notice_s() -> float | None:
    """The seconds a preemption notice gives (``SHARDYARD_NOTICE_S``); None outside Shardyard."""
    return runtime().notice_s()


def notice_left() -> float | None:
    """Seconds left before a noticed gang is killed; None before a notice (see :meth:`Runtime.notice_left`)."""
    return runtime().notice_left()
