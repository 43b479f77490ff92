"""Preemption as the node agent and the shard runner agree on it: the notice. Torch-free, so the agent can import it.

The agent asks a shard to checkpoint and stop by sending it :data:`STOP_SIGNAL`, the notice; the scheduler revokes
the shard (SIGTERM, then SIGKILL) if its gang has not stopped ``notice_s`` seconds later. Every shard, the built-in
runner's and a job's own script's, learns both from its environment (:func:`notice_env`):
``SHARDYARD_NOTICE_SIGNAL`` names the signal (``SIGUSR1``), ``SHARDYARD_NOTICE_S`` the seconds (the scheduler's
``preempt_deadline_s``, :data:`DEFAULT_NOTICE_S` unless set). A shard acknowledges by exiting ``PREEMPTED`` (75)
once its checkpoint is complete; the gang counts as stopped when every shard has.

The runner's handler only raises a flag (:class:`StopFlag`); the ranks agree on a stop point (with local SGD the
furthest step a rank had reached, :mod:`shardyard.training.notice`; with gradient averaging the step in flight) and stop
together there, rank 0 having written the gang's state to ``<output>/checkpoint`` (:data:`CHECKPOINT_SUBDIR`). The agent
starts every shard with the signal blocked, so a request that arrives while the runner is still importing torch stays
pending until the handler is installed instead of killing the process; a job's own script unblocks it once its handler
is in place (``docs/users/own-script.md``).
"""

from __future__ import annotations

import signal
import time
from pathlib import PurePosixPath
from typing import Final

STOP_SIGNAL: Final = signal.SIGUSR1
CHECKPOINT_SUBDIR: Final = "checkpoint"
RESUME_DIR_ENV: Final = "SHARDYARD_RESUME_DIR"
NOTICE_SIGNAL_ENV: Final = "SHARDYARD_NOTICE_SIGNAL"
NOTICE_S_ENV: Final = "SHARDYARD_NOTICE_S"
DEFAULT_NOTICE_S: Final = 30.0
"""The notice of an assignment that does not say (one from a scheduler older than the field): the scheduler's
default ``preempt_deadline_s``."""


def notice_env(notice_s: float | None) -> dict[str, str]:
    """The variables that tell a shard the notice it gets: the signal's name and the seconds it gives."""
    return {NOTICE_SIGNAL_ENV: STOP_SIGNAL.name, NOTICE_S_ENV: repr(DEFAULT_NOTICE_S if notice_s is None else notice_s)}


def checkpoint_job_path(output_path: str) -> str:
    """Where a shard whose output is ``output_path`` (a job path) leaves its preemption checkpoint."""
    return str(PurePosixPath(output_path) / CHECKPOINT_SUBDIR)


class StopFlag:
    """Raised once a stop was requested (the notice); the training loop reads it after every step."""

    def __init__(self) -> None:
        self.requested = False
        self.at: float | None = None
        """When the first request came (``time.monotonic()``); None before."""

    def request(self) -> None:
        if self.at is None:
            self.at = time.monotonic()
        self.requested = True

    @classmethod
    def install(cls) -> StopFlag:
        """A flag raised by :data:`STOP_SIGNAL` from now on (main thread only), with the signal unblocked.

        System calls the signal interrupts are restarted (no ``EINTR`` in the communication threads); a signal that
        was pending while blocked is delivered as soon as it is unblocked here.
        """
        flag = cls()
        signal.signal(STOP_SIGNAL, lambda _signum, _frame: flag.request())
        signal.siginterrupt(STOP_SIGNAL, False)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {STOP_SIGNAL})
        return flag
