"""JSON-lines progress reports from a shard to its node agent over an inherited file descriptor, and the progress
lines of the shard's own log."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

Clock = Callable[[], float]

MAX_FAILED_CHARS = 2000
"""A ``failed`` report's message is cut here: a line stays within one pipe write (PIPE_BUF, 4 KiB)."""
MIN_INTERVAL_S = 1.0
"""At most one (unforced) progress line a second per shard: each becomes an event that about six consumers read, and
the control plane shares the node with training (``bench/training.py`` counts what that costs)."""


class StepLog:
    """Progress lines in the shard's log (stderr: the agent makes the log the shard's stdout and stderr, both), one
    line each, with the wall time the step ended (UTC, to the microsecond):
    ``<where>: step 200/300 loss 2.345 syncs 2 at 2026-12-07T15:57:32.123456Z``.

    One at every parameter sync; between syncs, and with gradients averaged at every step (every step a sync), at
    most one every ``min_interval_s`` (0: one every step, the agent's ``step_log_every_s``); the first step's and
    the last's always. The loss is this rank's at that step: at the last step, the final loss it reports."""

    def __init__(
        self,
        where: str,
        max_steps: int,
        min_interval_s: float = MIN_INTERVAL_S,
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
    ) -> None:
        self.where, self.max_steps = where, max_steps
        self._min_interval_s, self._clock, self._wall = min_interval_s, clock, wall
        self._last_t: float | None = None

    def step(self, step: int, loss: float, syncs: int, *, synced: bool) -> bool:
        """Step ``step`` is done (``synced``: with a parameter sync); returns whether a line was written."""
        now = self._clock()
        due = self._last_t is None or now - self._last_t >= self._min_interval_s
        if not (due or synced or step == self.max_steps):
            return False
        self._last_t = now
        with contextlib.suppress(OSError):  # a log on a full disk does not stop training
            at = datetime.fromtimestamp(self._wall(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            print(f"{self.where}: step {step}/{self.max_steps} loss {loss:.4g} syncs {syncs} at {at}", file=sys.stderr)
        return True


class ProgressReporter:
    """Writes one JSON object per line to ``fd`` (``None``: reports go nowhere).

    ``progress`` lines are rate-limited to one per ``min_interval_s`` unless forced; the first one is always
    written. Their ``loss`` is the mean over the steps since the previous progress line, ``samples_per_s`` and
    ``cpu_percent`` (process CPU time / wall time x 100, so > 100 with several busy threads) cover the same
    window. If the reader goes away (EPIPE, EBADF) reporting is switched off and training carries on.
    Lines may come from two threads (``checkpointed`` from the checkpoint writer): each is written whole.
    """

    def __init__(
        self,
        fd: int | None,
        min_interval_s: float = MIN_INTERVAL_S,
        clock: Clock = time.monotonic,
        cpu_clock: Clock = time.process_time,
        wall: Clock = time.time,
    ) -> None:
        self._fd = fd
        self._min_interval_s = min_interval_s
        self._clock, self._wall = clock, wall
        self._cpu_clock = cpu_clock
        self._last_line_t: float | None = None
        self._window_t0 = clock()
        self._window_cpu0 = cpu_clock()
        self._window_samples0 = 0
        self._window_step0: int | None = None
        """The step before the window's; None before the first line (the attempt's first step, always reported, whose
        window is that step and the start before it)."""
        self._window_compute0 = 0.0
        self._loss_sum = 0.0
        self._loss_n = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def started(self, world_size: int, rank: int) -> None:
        self._emit({"kind": "started", "world_size": world_size, "rank": rank})

    def progress(
        self,
        *,
        step: int,
        loss: float,
        samples: int,
        allreduce_ms: float,
        allreduce_bytes: int,
        syncs: int,
        sync_interval: int | None = None,
        slow_syncs: int = 0,
        compute_s: float = 0.0,
        force: bool = False,
        ago_s: float = 0.0,
    ) -> bool:
        """Record one step (``samples``: cumulative samples so far); returns whether a line was written.

        ``allreduce_ms`` is the last sync's time; ``sync_interval`` the current one (it widens after slow syncs,
        ``slow_syncs`` of them so far); ``compute_s`` the rank's own time in its steps so far, its waits on the gang
        left out. A line's ``step_ms`` and ``compute_ms`` are the window's means per step: wall time, and own time
        (the stragglers' detector, ``shardyard.stragglers``, compares the latter across the gang). A line's ``at`` is
        the wall time the step ended, which the agent dates its event by (it may read the line late: paused, or
        busy); ``ago_s``: the step ended that long ago (a line sent late: the last step before a failure, see
        ``Steps.report_last``), also in the line."""
        if self._fd is None:
            return False
        self._loss_sum += loss
        self._loss_n += 1
        now = self._clock() - max(0.0, ago_s)  # the window ends with the step
        if not force and self._last_line_t is not None and now - self._last_line_t < self._min_interval_s:
            return False
        cpu_now = self._cpu_clock()
        wall = now - self._window_t0
        steps = step - (step - 1 if self._window_step0 is None else self._window_step0)
        record = {
            "kind": "progress",
            "step": step,
            "loss": self._loss_sum / self._loss_n,
            "samples_per_s": (samples - self._window_samples0) / wall if wall > 0 else 0.0,
            "allreduce_ms": allreduce_ms,
            "allreduce_bytes": allreduce_bytes,
            "syncs": syncs,
            "cpu_percent": 100.0 * (cpu_now - self._window_cpu0) / wall if wall > 0 else 0.0,
            "slow_syncs": slow_syncs,
            "step_ms": 1000.0 * wall / steps if steps > 0 else 0.0,
            "compute_ms": 1000.0 * (compute_s - self._window_compute0) / steps if steps > 0 else 0.0,
        }
        if sync_interval is not None:
            record["sync_interval"] = sync_interval
        record["at"] = round(self._wall() - max(0.0, ago_s), 6)
        if ago_s > 0:
            record["ago_s"] = round(ago_s, 6)
        self._last_line_t = self._window_t0 = now
        self._window_cpu0 = cpu_now
        self._window_samples0 = samples
        self._window_step0, self._window_compute0 = step, compute_s
        self._loss_sum, self._loss_n = 0.0, 0
        self._emit(record)
        return self._fd is not None

    def finished(self, final_loss: float, steps: int, checkpoint_dir: str | os.PathLike[str] | None) -> None:
        ckpt = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self._emit({"kind": "finished", "final_loss": final_loss, "steps": steps, "checkpoint_dir": ckpt})

    def preempted(self, step: int, checkpoint_dir: str | os.PathLike[str] | None) -> None:
        """The gang stopped on request at ``step``; rank 0 names the checkpoint it wrote."""
        ckpt = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self._emit({"kind": "preempted", "step": step, "checkpoint_dir": ckpt})

    def checkpointed(
        self, step: int, checkpoint_dir: str | os.PathLike[str], *, snapshot_ms: float, write_ms: float
    ) -> None:
        """Rank 0 put the gang's state at ``step`` in place (``snapshot_ms`` on the training thread, ``write_ms`` on
        the writer's)."""
        self._emit(
            {
                "kind": "checkpointed",
                "step": step,
                "checkpoint_dir": os.fspath(checkpoint_dir),
                "snapshot_ms": round(snapshot_ms, 3),
                "write_ms": round(write_ms, 3),
            }
        )

    def failed(self, cause: str, message: str) -> None:
        """Why the shard is about to fail, where its exit code cannot say it all: a storage fault's path and the space
        left there. It goes over the progress pipe, not only the log: the log may be on the disk that filled."""
        self._emit({"kind": "failed", "cause": cause, "message": message[:MAX_FAILED_CHARS]})

    def close(self) -> None:
        """Close the descriptor (the reader then sees EOF); later reports go nowhere."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _emit(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._emit_locked(record)

    def _emit_locked(self, record: dict[str, Any]) -> None:
        if self._fd is None:
            return
        clean = {k: _finite_or_none(v) for k, v in record.items()}
        data = (json.dumps(clean, allow_nan=False, separators=(",", ":")) + "\n").encode()
        try:
            view = memoryview(data)
            while view:  # lines are < PIPE_BUF, so one write; loop anyway for partial writes
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError as exc:
            print(f"shardyard.training: progress fd {self._fd} unusable ({exc}); reporting disabled", file=sys.stderr)
            self._fd = None


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN/Infinity: a diverged loss is reported as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
