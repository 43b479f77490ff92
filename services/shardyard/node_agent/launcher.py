"""Starting shard processes: the seam between the agent and the operating system.

Each shard is one child process started from an argv list (never a shell) with a private progress pipe. Children
are bound to the agent's life (Linux ``PR_SET_PDEATHSIG``): an agent that dies takes its shards with it, so a shard
never outlives the lease of the agent that started it. Children start with the stop signal blocked: a stop request
sent before the runner installed its handler stays pending for it instead of killing the process.
"""

import asyncio
import contextlib
import ctypes
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from shardyard.training.preemption import STOP_SIGNAL

_PR_SET_PDEATHSIG = 1


def _prepare_child() -> None:  # runs in the child between fork and exec
    signal.pthread_sigmask(signal.SIG_BLOCK, {STOP_SIGNAL})  # the mask survives exec; the runner unblocks it
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the agent's shutdown still stops its shards


@dataclass(frozen=True)
class LaunchSpec:
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: Path
    log_path: Path


class ShardProcess(Protocol):
    @property
    def pid(self) -> int: ...

    def progress(self) -> AsyncIterator[bytes]:
        """Lines the shard writes to its progress channel, until it closes it."""
        ...

    async def wait(self) -> int: ...

    def signal(self, sig: int) -> None:
        """Send ``sig``; nothing happens once the process has exited."""
        ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


class Launcher(Protocol):
    async def launch(self, spec: LaunchSpec, *, progress_env: str) -> ShardProcess: ...


class _Subprocess:
    def __init__(self, process: asyncio.subprocess.Process, reader: asyncio.StreamReader) -> None:
        self._process = process
        self._reader = reader

    @property
    def pid(self) -> int:
        return self._process.pid

    async def progress(self) -> AsyncIterator[bytes]:
        while line := await self._reader.readline():
            yield line

    async def wait(self) -> int:
        return await self._process.wait()

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._process.send_signal(sig)

    def terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._process.terminate()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._process.kill()


class SubprocessLauncher:
    """Real processes. The progress channel's file descriptor number is passed in ``progress_env``."""

    async def launch(self, spec: LaunchSpec, *, progress_env: str) -> ShardProcess:
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        read_fd, write_fd = os.pipe()
        env = {**spec.env, progress_env: str(write_fd)}
        try:
            with open(spec.log_path, "ab") as log:  # noqa: ASYNC230 - a local log file; opening it does not block
                process = await asyncio.create_subprocess_exec(
                    *spec.argv,
                    env=env,
                    cwd=spec.cwd,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    pass_fds=(write_fd,),
                    preexec_fn=_prepare_child,
                )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0))
        return _Subprocess(process, reader)


def tail(path: Path, lines: int = 6, max_bytes: int = 4096) -> str:
    """The last lines of a shard's log, for failure messages."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])
