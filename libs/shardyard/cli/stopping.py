"""Stopping a local cluster's processes: by group (agents, services, broker), SIGTERM then SIGKILL."""

import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence

from shardyard.cli.children import alive


def stop_processes(pids: Mapping[str, int], *, timeout_s: float = 15.0) -> None:
    """SIGTERM by group, agents, then services, then the broker: each group leaves the bus while the broker still
    answers. SIGKILL for what still runs after ``timeout_s``; returns once all of it is gone (or 5 s more)."""
    groups = (
        [n for n in pids if n.startswith("node-")],
        [n for n in pids if not n.startswith("node-") and n != "broker"],
        [n for n in pids if n == "broker"],
    )
    for group in groups:
        for name in group:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pids[name], signal.SIGTERM)
        _gone([pids[n] for n in group], timeout_s)
        for name in group:
            if alive(pids[name]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pids[name], signal.SIGKILL)
        _gone([pids[n] for n in group], 5.0)


def _gone(pids: Sequence[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        _reap()
        time.sleep(0.1)
    _reap()


def _reap() -> None:
    """Collect exited children when ``up`` and ``down`` run in one process (the demo)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
