"""``python -m shardyard.training.entry [--cwd DIR] -- COMMAND [ARG...]``: how the node agent runs a job's own command.

A user's script runs none of Shardyard's code, so the agent starts it under this small supervisor. Torch-free and
single-threaded, it costs a few tens of milliseconds and a few MiB. It

- starts COMMAND (an argv list, never through a shell) in DIR as its only child, in a process group of its own, bound
  to the supervisor's life (``PR_SET_PDEATHSIG``), with the stop signal blocked until :mod:`shardyard.train` installs
  its handler. An unmodified script never unblocks it: a stop request leaves it running, and the scheduler revokes it
  at the preemption deadline;
- watches the agent's lease as :mod:`shardyard.training.lease` does (``SHARDYARD_AGENT_LEASE_FILE``, checked every
  0.2 s). Once the lease is older than ``SHARDYARD_AGENT_LEASE_S`` it kills the script's whole process group and
  exits ``FENCED``, so a paused or cut-off agent cannot leave a user's script training beside its replacement;
- forwards SIGTERM, SIGINT and SIGHUP to the script's process group and the stop signal (preemption) to the script.
  A group still there :data:`TERM_GRACE_S` after a SIGTERM is killed;
- passes the progress channel (``SHARDYARD_PROGRESS_FD``) on to the script and keeps no copy;
- on rank 0, when the agent runs the gang's ranks as clients of a store the runtime hosts
  (``TORCHELASTIC_USE_AGENT_STORE=True``, as torchrun does), hosts it (:mod:`shardyard.training.store`: on
  MASTER_ADDR only, not on every interface as the script's own would) until the script ends;
- exits with the script's status, so the agent classifies it as it does the built-in runner's
  (:func:`shardyard.training.exitcodes.classify_exit`):

  ================================================  ==========================================================
  the script                                        the supervisor exits with
  ================================================  ==========================================================
  exits 0                                           0: OK
  exits ``USER_ERROR`` (3) or ``PREEMPTED`` (75)    the same: the exit codes of :mod:`shardyard.train`
  exits 4, 6, 7, 8, 9, 10 or 11                     ``INTERNAL_ERROR`` (5): the runtime reserves these codes
                                                    (COMM_ERROR ... IO_ERROR); from a script they are a plain
                                                    process exit (the agent reads a full disk or an I/O error
                                                    from the script's last log lines instead)
  exits with any other status n                     n: a process exit (retried), or KILLED for 129..192
  dies of signal n                                  128 + n: KILLED
  cannot be started: not found, not executable,     ``USER_ERROR`` (not retried), the reason on stderr
  DIR missing
  ================================================  ==========================================================

  Every non-zero end is explained in one line on stderr, which the agent quotes in the shard's failure. Whatever
  the script leaves running in its process group when it ends is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Final

from shardyard.errors import ShardyardError
from shardyard.training import exitcodes, store
from shardyard.training.exitcodes import ExitCause, classify_exit
from shardyard.training.lease import CHECK_EVERY_S, DEFAULT_SHARD_LEASE_S, LEASE_FILE_ENV, LEASE_S_ENV, expired
from shardyard.training.preemption import STOP_SIGNAL

MODULE: Final = "shardyard.training.entry"
PROGRESS_FD_ENV: Final = "SHARDYARD_PROGRESS_FD"
CHECKPOINT_DIR_ENV: Final = "SHARDYARD_CHECKPOINT_DIR"
"""Where the job's checkpoint lives (``<output>/checkpoint``): :func:`shardyard.train.save` writes it, recovery and
preemption resume from it."""
SYNC_INTERVAL_ENV: Final = "SHARDYARD_SYNC_INTERVAL"
TERM_GRACE_S: Final = 4.0
"""After forwarding a SIGTERM, the script's group is killed if still there (below the agent's own 5 s grace)."""
CLIENT_EXIT_CODES: Final = frozenset({exitcodes.OK, exitcodes.USER_ERROR, exitcodes.PREEMPTED})
_FORWARDED: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_CANNOT_START: Final = frozenset(
    {errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.E2BIG}
)
"""Reasons a command cannot be started that are the command's fault (or the job's), not the node's."""
_PR_SET_PDEATHSIG: Final = 1
_SAY: Final = "shardyard entry"


class UsageError(ShardyardError, ValueError):
    """The supervisor's own arguments are wrong (the agent built them: an internal error)."""


@dataclass(frozen=True)
class Invocation:
    command: tuple[str, ...]
    cwd: str | None = None


def parse_args(argv: Sequence[str]) -> Invocation:
    """``[--cwd DIR] -- COMMAND [ARG...]``; everything after ``--`` is the command, verbatim."""
    args = list(argv)
    cwd = None
    while args and args[0] != "--":
        option = args.pop(0)
        if option == "--cwd" and args:
            cwd = args.pop(0)
        else:
            raise UsageError(f"unexpected argument {option!r}; usage: python -m {MODULE} [--cwd DIR] -- COMMAND...")
    if len(args) < 2:
        raise UsageError(f"no command given; usage: python -m {MODULE} [--cwd DIR] -- COMMAND...")
    return Invocation(command=tuple(args[1:]), cwd=cwd)


def exit_status(returncode: int) -> int:
    """The supervisor's exit status for a script that ended with ``returncode`` (``Popen.returncode``)."""
    if returncode < 0:
        return 128 - returncode
    if returncode in CLIENT_EXIT_CODES:
        return returncode
    if classify_exit(returncode) in (ExitCause.PROCESS_EXIT, ExitCause.KILLED):
        return returncode
    return exitcodes.INTERNAL_ERROR


def describe_end(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the command was killed by {name}"
    status = exit_status(returncode)
    if status != returncode:
        return (
            f"the command exited with status {returncode}, reported as {status} (a process exit): "
            f"{returncode} is reserved by the runtime"
        )
    return f"the command exited with status {returncode}"


def _say(message: str) -> None:
    print(f"{_SAY}: {message}", file=sys.stderr, flush=True)


def _child_setup(parent: int) -> Callable[[], None]:
    def prepare() -> None:  # runs in the child between fork and exec
        os.setpgid(0, 0)  # a group of its own: the supervisor stops the script and everything it started
        signal.pthread_sigmask(signal.SIG_BLOCK, {STOP_SIGNAL})  # held for shardyard.train's handler
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died before the binding took: do not run unsupervised
            os._exit(128 + signal.SIGKILL)

    return prepare


def _store_setup(parent: int) -> Callable[[], None]:
    def prepare() -> None:  # runs in the child between fork and exec
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(128 + signal.SIGKILL)

    return prepare


def _host_store(env: Mapping[str, str]) -> subprocess.Popen[bytes] | None:
    """Rank 0's store host, when the ranks are to be clients of one (:mod:`shardyard.training.store`), bound to the
    supervisor's life. None on the other ranks, or when the ranks host their own."""
    if env.get(store.AGENT_STORE_ENV) != "True" or env.get("RANK") != "0":
        return None
    return subprocess.Popen(
        [sys.executable, "-m", store.MODULE],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        preexec_fn=_store_setup(os.getpid()),
    )


def _end(host: subprocess.Popen[bytes] | None) -> None:
    """The script ended: its store serves nobody now (it may still be importing torch: no waiting for it)."""
    if host is None:
        return
    host.kill()
    host.wait()
    if host.stdin is not None:
        host.stdin.close()


def _kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _progress_fds(env: Mapping[str, str]) -> tuple[int, ...]:
    raw = env.get(PROGRESS_FD_ENV, "")
    try:
        fd = int(raw)
        os.fstat(fd)
    except (ValueError, OSError):
        return ()
    return (fd,)


class _Signals:
    """Signals for the script, forwarded as they come (recorded while there is no script yet)."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.terminated: int | None = None
        self.kill_at: float | None = None
        self.stop_pending = False

    def install(self) -> None:
        for sig in _FORWARDED:
            signal.signal(sig, self._terminate)
        signal.signal(STOP_SIGNAL, self._stop)
        signal.siginterrupt(STOP_SIGNAL, False)

    def _terminate(self, signum: int, _frame: FrameType | None) -> None:
        self.terminated = self.terminated or signum
        if self.child is not None:
            _kill_group(self.child.pid, signum)
            if signum == signal.SIGTERM and self.kill_at is None:
                self.kill_at = time.monotonic() + TERM_GRACE_S

    def _stop(self, _signum: int, _frame: FrameType | None) -> None:
        if self.child is None:
            self.stop_pending = True
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.child.pid, STOP_SIGNAL)

    def started(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child
        if self.terminated is not None:
            self._terminate(self.terminated, None)
        if self.stop_pending:
            self._stop(STOP_SIGNAL, None)


def _start(invocation: Invocation, env: Mapping[str, str]) -> subprocess.Popen[bytes] | str:
    """The running script, or why it cannot be started (a user error)."""
    cwd = invocation.cwd
    if cwd is not None and not os.path.isdir(cwd):
        return f"cannot run {invocation.command[0]!r}: working_dir {cwd} is not a directory"
    fds = _progress_fds(env)
    try:
        child = subprocess.Popen(
            invocation.command, cwd=cwd, stdin=subprocess.DEVNULL, pass_fds=fds, preexec_fn=_child_setup(os.getpid())
        )
    except OSError as exc:
        if exc.errno not in _CANNOT_START:
            raise
        program = invocation.command[0]
        where = f" in {cwd}" if cwd else ""
        reason = exc.strerror or str(exc)
        if exc.errno == errno.ENOENT and "/" not in program:
            reason = f"not found on PATH ({env.get('PATH', '')})"
        return f"cannot run {program!r}{where}: {reason}"
    for fd in fds:  # the script holds the channel now: the agent sees its end when the script's end comes
        with contextlib.suppress(OSError):
            os.close(fd)
    return child


def supervise(invocation: Invocation, env: Mapping[str, str], *, clock: Callable[[], float] = time.time) -> int:
    """Run the script to its end (or until the lease runs out) and return the supervisor's exit status."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {STOP_SIGNAL})  # the agent starts us so; a run by hand too
    signals = _Signals()
    signals.install()
    if signals.terminated is not None:  # stopped before anything ran (the SIGTERM was pending)
        return 128 + signals.terminated
    host = _host_store(env)
    try:
        return _run(invocation, env, signals, clock)
    finally:
        _end(host)


def _run(invocation: Invocation, env: Mapping[str, str], signals: _Signals, clock: Callable[[], float]) -> int:
    started = _start(invocation, env)
    if isinstance(started, str):
        _say(started)
        return exitcodes.USER_ERROR
    child = started
    signals.started(child)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {STOP_SIGNAL})  # a stop that came before the script is forwarded now
    lease_file = env.get(LEASE_FILE_ENV)
    lease_s = float(env.get(LEASE_S_ENV, DEFAULT_SHARD_LEASE_S))
    while True:
        try:
            returncode = child.wait(timeout=CHECK_EVERY_S)
            break
        except subprocess.TimeoutExpired:
            pass
        if lease_file and (silent := expired(lease_file, clock(), lease_s)) is not None:
            _kill_group(child.pid)
            child.wait()
            _say(f"self-fenced: agent silent for {silent:.1f} s; the command was killed")
            return exitcodes.FENCED
        if signals.kill_at is not None and time.monotonic() >= signals.kill_at:
            _kill_group(child.pid)
    _kill_group(child.pid)  # what the script left behind in its group
    if returncode != 0:
        _say(describe_end(returncode))
    return exit_status(returncode)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        invocation = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        _say(str(exc))
        return exitcodes.INTERNAL_ERROR
    return supervise(invocation, os.environ)


if __name__ == "__main__":
    sys.exit(main())
