"""The shard's side of self-fencing: a shard stops by itself when its agent goes silent.

An agent that is paused (``SIGSTOP``), starved or cut off from the bus cannot stop its shards; yet after
``suspect_after_s`` (3 s) of silence the resource pool suspects its node and the gang is re-formed elsewhere. So every
shard runs a watchdog thread over a lease the agent renews: the agent touches ``SHARDYARD_AGENT_LEASE_FILE`` each time
a heartbeat of its reaches the bus, and a shard whose lease file is older than ``SHARDYARD_AGENT_LEASE_S`` (below the
pool's suspicion bound) exits at once with ``FENCED``, even when its main thread is blocked in a collective. Without
those variables (a shard run by hand, a test) there is no watchdog. Torch-free: the agent imports it.

On a loaded host the file holds the margin the agent's last beat carried (``shardyard.liveness``): the pool suspects
the node that much later, and the lease lasts that much longer, so a starved agent does not fence healthy shards.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Final

from shardyard.liveness import MAX_MARGIN_S
from shardyard.training import exitcodes

LEASE_FILE_ENV: Final = "SHARDYARD_AGENT_LEASE_FILE"
LEASE_S_ENV: Final = "SHARDYARD_AGENT_LEASE_S"
DEFAULT_SHARD_LEASE_S: Final = 2.5
CHECK_EVERY_S: Final = 0.2


def silence(path: str, now: float) -> float:
    """Seconds since the agent last renewed the lease; infinite when the file is gone."""
    try:
        return now - os.stat(path).st_mtime
    except OSError:
        return float("inf")


def margin(path: str) -> float:
    """The margin the agent wrote with its last renewal (0 when none, or unreadable), at most ``MAX_MARGIN_S``."""
    try:
        with open(path) as f:
            written = float(f.read(32) or 0.0)
    except (OSError, ValueError):
        return 0.0
    return min(max(written, 0.0), MAX_MARGIN_S)


def expired(path: str, now: float, lease_s: float) -> float | None:
    """The agent's silence once it outlasted the lease (``lease_s`` plus the margin); None while the lease holds."""
    silent = silence(path, now)
    return silent if silent >= lease_s + margin(path) else None


def renew(path: str, margin_s: float = 0.0) -> None:
    """The agent's side: the lease runs from now, ``margin_s`` longer than its length (written whole, then moved
    into place, so a shard never reads half of it)."""
    fresh = f"{path}.new"
    with open(fresh, "w") as f:
        os.fchmod(f.fileno(), 0o644)  # a shard under a user of its own reads it; it says nothing secret
        f.write(f"{margin_s:g}")
    os.replace(fresh, path)


def start_watchdog(
    env: Mapping[str, str], *, exit_now: Callable[[int], object] = os._exit, clock: Callable[[], float] = time.time
) -> threading.Thread | None:
    """Start the watchdog when the environment names a lease; None otherwise."""
    path = env.get(LEASE_FILE_ENV)
    if not path:
        return None
    lease_s = float(env.get(LEASE_S_ENV, DEFAULT_SHARD_LEASE_S))

    def watch() -> None:
        while True:
            silent = expired(path, clock(), lease_s)
            if silent is not None:
                print(f"shardyard runner: self-fenced: agent silent for {silent:.1f} s", file=sys.stderr, flush=True)
                exit_now(exitcodes.FENCED)
                return
            time.sleep(CHECK_EVERY_S)

    thread = threading.Thread(target=watch, name="agent-lease", daemon=True)
    thread.start()
    return thread
