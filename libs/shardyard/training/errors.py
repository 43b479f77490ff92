"""How a training shard fails, as exceptions; :func:`shardyard.training.runner.main` turns each into its exit code.

::

    ShardyardError (shardyard.errors)
    ├── UserError            bad config, model, dataset or resume checkpoint        -> USER_ERROR
    ├── DeviceError          the shard's GPU (LOCAL_RANK) is not there               -> GPU_FAULT
    └── CommError            torch.distributed init / collective / barrier failed   -> COMM_ERROR
        └── SyncTimeoutError a parameter or gradient sync past its timeout          -> SYNC_TIMEOUT
    Exception
    └── Terminated           SIGTERM from the agent (revoked, fenced, shut down)   -> 128 + SIGTERM

The training runtime's other errors are ShardyardErrors too, and ValueErrors where they were: ``CheckpointError``
(:mod:`~shardyard.training.model`), ``ConfigError`` (:mod:`~shardyard.training.config`, a
:class:`shardyard.errors.ConfigError`), ``DatasetError`` (:mod:`~shardyard.training.data`), ``UsageError``
(:mod:`~shardyard.training.entry`) and ``OrderError`` (:mod:`~shardyard.training.standby`).

An out-of-memory error or a CUDA fault raised inside a collective becomes a :class:`CommError` raised from it;
:func:`shardyard.training.exitcodes.fault_exit_code` still finds it in the chain and the shard exits OOM or
GPU_FAULT.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from shardyard.errors import ShardyardError
from shardyard.training import exitcodes


class UserError(ShardyardError):
    """A problem with what the user supplied (config, checkpoint, dataset): exit USER_ERROR."""


class DeviceError(ShardyardError):
    """The GPU this shard was given is not visible to it: exit GPU_FAULT, so the node is left out of the retry."""


class CommError(ShardyardError):
    """A torch.distributed failure: exit COMM_ERROR."""


class SyncTimeoutError(CommError):
    """A sync did not complete within its timeout: exit SYNC_TIMEOUT."""


class Terminated(Exception):
    """The agent asked this shard to end now (SIGTERM: revoked, fenced, or the agent shuts down)."""


_COLLECTIVE_ERRORS = (RuntimeError, OSError, TimeoutError, ValueError)
"""What a failed collective raises: gloo raises plain RuntimeErrors, not only DistError."""


@contextlib.contextmanager
def comm(what: str) -> Iterator[None]:
    """Errors raised inside are communication failures."""
    try:
        yield
    except _COLLECTIVE_ERRORS as exc:
        raise CommError(f"{what} failed: {describe(exc)}") from exc


@contextlib.contextmanager
def sync_comm(what: str, timeout_s: float) -> Iterator[None]:
    """Like :func:`comm`, but a failure that is a timeout is a :class:`SyncTimeoutError`."""
    t0 = time.monotonic()
    try:
        yield
    except _COLLECTIVE_ERRORS as exc:
        elapsed = time.monotonic() - t0
        if exitcodes.is_sync_timeout(str(exc), elapsed, timeout_s):
            raise SyncTimeoutError(f"{what} timed out after {elapsed:.1f} s: {describe(exc)}") from exc
        raise CommError(f"{what} failed: {describe(exc)}") from exc


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split()) or type(exc).__name__}"
