"""Exit codes the shard runner uses, how the runner picks one for an exception, and how the node agent classifies
a shard process's return code. Torch-free: the agent imports it."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

OK: Final = 0
USER_ERROR: Final = 3
"""Missing/invalid model or dataset directory, bad configuration, empty dataset."""
COMM_ERROR: Final = 4
"""torch.distributed errors during process-group init, AllReduce or barrier (a peer went away, a rendezvous timed
out)."""
INTERNAL_ERROR: Final = 5
"""Anything else (a bug, an unexpected exception)."""
OOM: Final = 6
"""Out of memory: ``torch.cuda.OutOfMemoryError`` (``torch.OutOfMemoryError``), ``MemoryError``, or an allocator that
says so. A shard the kernel's OOM killer ends dies by SIGKILL and stays KILLED: that cannot be told apart."""
GPU_FAULT: Final = 7
"""A CUDA error that points at the device, not the program: illegal memory access, ECC error, launch failure..."""
SYNC_TIMEOUT: Final = 8
"""A parameter AllReduce did not complete within ``SHARDYARD_SYNC_TIMEOUT_S``: a peer hangs (or is unreachable)."""
FENCED: Final = 9
"""The shard stopped itself: its agent stopped renewing the shard lease (see :mod:`shardyard.training.lease`)."""
DISK_FULL: Final = 10
"""A write failed for want of space (ENOSPC, EDQUOT): a checkpoint, the final model, anything on the shard's disks.
The runner's last report names the path and the space left (:mod:`shardyard.training.storage`)."""
IO_ERROR: Final = 11
"""A read or write failed on the device (EIO), or its filesystem went read-only (EROFS)."""
PREEMPTED: Final = 75
"""Stopped on request (preemption) after the gang checkpointed; not a failure. 75 is ``EX_TEMPFAIL`` of
``sysexits.h``: "try again later", which is what a preempted shard's job does."""

_SHELL_SIGNAL_BASE: Final = 128
_MAX_SIGNAL: Final = 64  # SIGRTMAX on Linux; 128+n above this is an ordinary exit status

_OOM_TYPES: Final = ("OutOfMemoryError",)  # torch.cuda.OutOfMemoryError / torch.OutOfMemoryError, by name
_OOM_MESSAGES: Final = ("out of memory", "can't allocate memory", "cannot allocate memory")
_GPU_FAULT_MESSAGES: Final = (
    "illegal memory access",
    "ecc error",
    "unspecified launch failure",
    "illegal instruction",
    "fallen off the bus",
    "gpu is lost",
)
_TIMEOUT_MESSAGES: Final = ("timed out", "timeout")
_TIMEOUT_SLACK: Final = 0.9
"""A collective that failed after this share of its timeout had passed failed by timing out, whatever it says."""


class ExitCause(StrEnum):
    OK = "ok"
    USER_ERROR = "user_error"
    COMM_ERROR = "comm_error"
    KILLED = "killed"
    PROCESS_EXIT = "process_exit"
    PREEMPTED = "preempted"
    OOM = "oom"
    GPU_FAULT = "gpu_fault"
    SYNC_TIMEOUT = "sync_timeout"
    FENCED = "fenced"
    DISK_FULL = "disk_full"
    IO_ERROR = "io_error"


_BY_CODE: Final = {
    OK: ExitCause.OK,
    USER_ERROR: ExitCause.USER_ERROR,
    COMM_ERROR: ExitCause.COMM_ERROR,
    PREEMPTED: ExitCause.PREEMPTED,
    OOM: ExitCause.OOM,
    GPU_FAULT: ExitCause.GPU_FAULT,
    SYNC_TIMEOUT: ExitCause.SYNC_TIMEOUT,
    FENCED: ExitCause.FENCED,
    DISK_FULL: ExitCause.DISK_FULL,
    IO_ERROR: ExitCause.IO_ERROR,
}


def classify_exit(returncode: int) -> ExitCause:
    """Map a shard's return code (as ``Popen.returncode`` reports it) to its cause.

    Negative codes are signals (``-9``, ``-15``); ``128 + n`` is a signal death reported by a shell wrapper. A
    SIGKILL is KILLED even where the kernel's OOM killer sent it. ``INTERNAL_ERROR`` and any other code are a plain
    ``PROCESS_EXIT``.
    """
    if returncode in _BY_CODE:
        return _BY_CODE[returncode]
    if returncode < 0 or _SHELL_SIGNAL_BASE < returncode <= _SHELL_SIGNAL_BASE + _MAX_SIGNAL:
        return ExitCause.KILLED
    return ExitCause.PROCESS_EXIT


def fault_exit_code(exc: BaseException) -> int | None:
    """``OOM`` or ``GPU_FAULT`` when ``exc`` or an exception it was raised from is one; None otherwise."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        names = {cls.__name__ for cls in type(current).__mro__}
        message = str(current).lower()
        if isinstance(current, MemoryError) or names & set(_OOM_TYPES) or any(m in message for m in _OOM_MESSAGES):
            return OOM
        if any(m in message for m in _GPU_FAULT_MESSAGES):
            return GPU_FAULT
        current = current.__cause__ or current.__context__
    return None


def is_sync_timeout(message: str, elapsed_s: float, timeout_s: float) -> bool:
    """Whether a failed collective failed by timing out: it says so (gloo: "Timed out waiting 30000ms for recv
    operation"), or it failed only once (nearly) all of its timeout had passed. A peer that died fails it at once,
    with "Connection closed by peer": that is a COMM_ERROR."""
    text = message.lower()
    return any(m in text for m in _TIMEOUT_MESSAGES) or elapsed_s >= _TIMEOUT_SLACK * timeout_s
