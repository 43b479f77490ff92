"""Exit codes the shard runner uses, and how the node agent classifies a shard process's return code."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

OK: Final = 0
USER_ERROR: Final = 3
"""Missing/invalid model or dataset directory, bad configuration, empty dataset."""
COMM_ERROR: Final = 4
"""torch.distributed errors or timeouts during process-group init, AllReduce or barrier."""
INTERNAL_ERROR: Final = 5
"""Anything else (a bug, an unexpected exception)."""
PREEMPTED: Final = 75
"""Stopped on request (preemption) after the gang checkpointed; not a failure. 75 is ``EX_TEMPFAIL`` of
``sysexits.h``: "try again later", which is what a preempted shard's job does."""

_SHELL_SIGNAL_BASE: Final = 128
_MAX_SIGNAL: Final = 64  # SIGRTMAX on Linux; 128+n above this is an ordinary exit status


class ExitCause(StrEnum):
    OK = "ok"
    USER_ERROR = "user_error"
    COMM_ERROR = "comm_error"
    KILLED = "killed"
    PROCESS_EXIT = "process_exit"
    PREEMPTED = "preempted"


def classify_exit(returncode: int) -> ExitCause:
    """Map a shard's return code (as ``Popen.returncode`` reports it) to its cause.

    Negative codes are signals (``-9``, ``-15``); ``128 + n`` is a signal death reported by a shell wrapper.
    ``INTERNAL_ERROR`` and any other code are a plain ``PROCESS_EXIT``. No OOM detection happens here.
    """
    if returncode == OK:
        return ExitCause.OK
    if returncode == USER_ERROR:
        return ExitCause.USER_ERROR
    if returncode == COMM_ERROR:
        return ExitCause.COMM_ERROR
    if returncode == PREEMPTED:
        return ExitCause.PREEMPTED
    if returncode < 0 or _SHELL_SIGNAL_BASE < returncode <= _SHELL_SIGNAL_BASE + _MAX_SIGNAL:
        return ExitCause.KILLED
    return ExitCause.PROCESS_EXIT
