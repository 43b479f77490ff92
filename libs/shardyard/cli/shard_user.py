"""Who the agents of a local cluster run shards as: each job's own user unless that cannot work here."""

import os
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path


def interpreter_blocked() -> str | None:
    """Why users other than this one cannot run this Python (a directory on the way to it, or to its standard
    library, that they may not search or read); None when they can. A pyenv under a 0700 ``/root`` is the usual
    case: agents running as root cannot start shards as their jobs' own users with it."""
    for target in (Path(sys.executable).resolve(), Path(os.__file__).resolve().parent):
        for directory in reversed(target.parents):
            if not os.stat(directory).st_mode & stat.S_IXOTH:
                return f"{directory} is closed to other users (on the way to {target})"
        if not os.stat(target).st_mode & stat.S_IROTH:
            return f"{target} is not readable by other users"
    return None


def shard_user_fallback(env: Mapping[str, str], say: Callable[[str], None]) -> list[str]:
    """Agent options for who runs shards: none (each job's own user, the agent's default) unless the operator chose
    (``SHARDYARD_SHARD_USER``), or agents run as root with a Python other users cannot run: then shards run as the
    agent, and ``up`` says so, since a job can then read another's environment and files."""
    if "SHARDYARD_SHARD_USER" in env or os.geteuid() != 0:
        return []
    why = interpreter_blocked()
    if why is None:
        return []
    say(
        f"warning: shards run as root, not as their jobs' own users: {why}. Install Python where other users can "
        "run it, or set SHARDYARD_SHARD_USER=agent to silence this"
    )
    return ["--shard-user", "agent"]
