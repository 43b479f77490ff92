"""Preemption as the node agent and the shard runner agree on it. Torch-free, so the agent can import it.

The agent asks a shard to stop by sending it :data:`STOP_SIGNAL`. The runner's handler only raises a flag
(:class:`StopFlag`); the ranks agree on the flag at their next parameter sync and stop together there, rank 0 having
written the gang's state to ``<output>/checkpoint`` (:data:`CHECKPOINT_SUBDIR`). The agent starts every shard with
the signal blocked, so a request that arrives while the runner is still importing torch stays pending until the
handler is installed instead of killing the process.
"""

from __future__ import annotations

import signal
from pathlib import PurePosixPath
from typing import Final

STOP_SIGNAL: Final = signal.SIGUSR1
CHECKPOINT_SUBDIR: Final = "checkpoint"
RESUME_DIR_ENV: Final = "SHARDYARD_RESUME_DIR"


def checkpoint_job_path(output_path: str) -> str:
    """Where a shard whose output is ``output_path`` (a job path) leaves its preemption checkpoint."""
    return str(PurePosixPath(output_path) / CHECKPOINT_SUBDIR)


class StopFlag:
    """Raised once a stop was requested; the training loop reads it at every parameter sync."""

    def __init__(self) -> None:
        self.requested = False

    def request(self) -> None:
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
