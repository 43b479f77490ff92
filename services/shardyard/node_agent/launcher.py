"""Starting shard processes: the seam between the agent and the operating system.

Each shard is one child process started from an argv list (never a shell) with a private progress pipe. Children
are bound to the agent's life (Linux ``PR_SET_PDEATHSIG``): an agent that dies takes its shards with it, so a shard
never outlives the lease of the agent that started it. Children start with the stop signal blocked: a stop request
sent before the runner installed its handler stays pending for it instead of killing the process.

A standby (:mod:`shardyard.training.standby`) is started the same way, with its standard input a pipe: the agent
writes it one order when it becomes a shard, or closes the pipe to discard it.

A spec with a ``user`` (:mod:`.shard_users`) starts the child as that uid/gid, with no supplementary groups and umask
0o077 (the agent must be root). The switch happens before the child's own set-up runs: the parent-death binding,
which a change of credentials clears, is made afterwards. The log is opened by the agent (mode 0600) and inherited
as stdout and stderr: the shard's user needs no access to it.
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

from shardyard.node_agent.private_files import open_log
from shardyard.node_agent.shard_users import UMASK, ShardUser
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
    user: ShardUser | None = None
    """Who the process runs as; None: the agent's own user."""


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


class Standby(Protocol):
    """A warm shard process waiting for its order."""

    @property
    def pid(self) -> int: ...

    def alive(self) -> bool: ...

    async def go(self, order: bytes) -> ShardProcess:
        """Hand it its order; from then on it is a shard. Raises OSError when it is gone."""
        ...

    def discard(self) -> None:
        """End it unused: SIGTERM (it installs no handler), SIGKILL after a grace period."""
        ...


class Launcher(Protocol):
    async def launch(self, spec: LaunchSpec, *, progress_env: str) -> ShardProcess: ...

    async def standby(self, spec: LaunchSpec, *, progress_env: str) -> Standby: ...


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


DISCARD_GRACE_S = 5.0


class _Standby:
    def __init__(self, process: asyncio.subprocess.Process, reader: asyncio.StreamReader) -> None:
        self._process = process
        self._shard = _Subprocess(process, reader)

    @property
    def pid(self) -> int:
        return self._process.pid

    def alive(self) -> bool:
        return self._process.returncode is None

    async def go(self, order: bytes) -> ShardProcess:
        stdin = self._process.stdin
        if stdin is None or not self.alive():
            raise OSError(f"standby {self.pid} is gone")
        try:
            stdin.write(order)
            await stdin.drain()
            stdin.close()
        except (ConnectionError, RuntimeError) as exc:
            raise OSError(f"standby {self.pid} is gone: {exc}") from exc
        return self._shard

    def discard(self) -> None:
        stdin = self._process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()
        self._shard.terminate()  # a standby has no handler for it: it ends at once, even while still importing
        asyncio.get_running_loop().call_later(DISCARD_GRACE_S, self._shard.kill)
        # Reap it (and close its pipes) whenever it ends: nobody waits on a discarded standby otherwise.
        task = asyncio.ensure_future(self._drain())
        _REAPING.add(task)
        task.add_done_callback(_REAPING.discard)

    async def _drain(self) -> None:
        async for _ in self._shard.progress():
            pass
        await self._process.wait()


_REAPING: set[asyncio.Future[None]] = set()


class SubprocessLauncher:
    """Real processes. The progress channel's file descriptor number is passed in ``progress_env``."""

    async def launch(self, spec: LaunchSpec, *, progress_env: str) -> ShardProcess:
        process, reader = await self._start(spec, progress_env, stdin=asyncio.subprocess.DEVNULL)
        return _Subprocess(process, reader)

    async def standby(self, spec: LaunchSpec, *, progress_env: str) -> Standby:
        process, reader = await self._start(spec, progress_env, stdin=asyncio.subprocess.PIPE)
        return _Standby(process, reader)

    @staticmethod
    async def _start(
        spec: LaunchSpec, progress_env: str, *, stdin: int
    ) -> tuple[asyncio.subprocess.Process, asyncio.StreamReader]:
        user = spec.user
        read_fd, write_fd = os.pipe()
        env = {**spec.env, progress_env: str(write_fd)}
        try:
            log = open_log(spec.log_path)  # a local log file; opening it does not block
            try:
                process = await asyncio.create_subprocess_exec(
                    *spec.argv,
                    env=env,
                    cwd=spec.cwd,
                    stdin=stdin,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    pass_fds=(write_fd,),
                    preexec_fn=_prepare_child,
                    user=None if user is None else user.uid,
                    group=None if user is None else user.gid,
                    extra_groups=None if user is None else [],
                    umask=-1 if user is None else UMASK,
                )
            finally:
                os.close(log)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0))
        return process, reader


def tail(path: Path, lines: int = 6, max_bytes: int = 4096) -> str:
    """The last lines of a shard's log, for failure messages. Only whole lines: a line cut by the ``max_bytes``
    window is left out, so that no part of a secret escapes the redaction of whole values (:mod:`.redaction`)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            start = max(0, size - max_bytes - 1)  # one byte before the window: does it start a line?
            handle.seek(start)
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    if start > 0:
        text = text.partition("\n")[2]
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])
