"""Mapping of the absolute paths jobs name (``/data/models/x``) onto this node's disk, through declared mounts.

``resolve`` maps any path (an unmapped one to itself); ``confine`` maps only a path the node serves and refuses the
rest with :class:`~shardyard.errors.JobPathError`, so a job's path can never make the agent look outside its mounts.

``PathProbe`` is the seam to the filesystem: whether a local directory is there (``LocalDisk`` asks the OS); ``look``
asks it about a job path, and answers a path it cannot look at with that path's error instead of raising.
"""

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Protocol

from shardyard.errors import ConfigError, JobPathError
from shardyard.mounts import host_path
from shardyard.node_agent.artifacts import Look, not_served, unreadable


def parse_mounts(items: Sequence[str]) -> dict[str, str]:
    """``["/data=/srv/shardyard/data"]`` -> ``{"/data": "/srv/shardyard/data"}``."""
    mounts: dict[str, str] = {}
    for item in items:
        prefix, sep, local = item.partition("=")
        if not sep or not prefix.startswith("/") or not local:
            raise ConfigError(f"cannot read mount {item!r}; write JOB_PREFIX=LOCAL_DIR, e.g. /data=./data")
        mounts[str(PurePosixPath(prefix))] = str(Path(local).resolve())
    return mounts


def parse_shared_mounts(items: Sequence[str]) -> tuple[str, ...]:
    """Job-path prefixes on shared (network) filesystems, e.g. ``["/data/shared/"]`` -> ``("/data/shared",)``."""
    prefixes: list[str] = []
    for item in items:
        if not item.startswith("/"):
            raise ConfigError(f"shared mount {item!r} is not an absolute job path prefix, e.g. /data/shared")
        prefixes.append(str(PurePosixPath(item)))
    return tuple(dict.fromkeys(prefixes))


def resolve(job_path: str, mounts: Mapping[str, str]) -> Path:
    """The local path of ``job_path``: the longest mounted prefix is replaced (``shardyard.mounts``); unmapped paths
    are used as they are."""
    local = host_path(job_path, mounts)
    return Path(job_path if local is None else local)


def confine(job_path: str, mounts: Mapping[str, str]) -> Path:
    """The local path of ``job_path`` if this node serves it, else :class:`JobPathError` (nothing is looked at).

    A served path is absolute and normalised (no ``.``, ``..`` or empty component; one trailing slash names the same
    directory and is allowed), has no NUL byte, and, when the node declares mounts, lies under one of them by whole
    components (the longest wins, as in ``resolve``). A node without mounts serves its own paths as they are. The
    messages never repeat the path: callers key them by it, and it may be thousands of characters long."""
    if "\x00" in job_path:
        raise JobPathError("the path contains a NUL byte")
    if not job_path.startswith("/"):
        raise JobPathError("the path is not absolute")
    if any(part in ("", ".", "..") for part in job_path.removesuffix("/").split("/")[1:]):
        raise JobPathError("the path is not normalised (a '.', '..' or empty component)")
    if not mounts:
        return Path(job_path)
    parts = PurePosixPath(job_path).parts
    for prefix in sorted(mounts, key=len, reverse=True):
        root = PurePosixPath(prefix).parts
        if parts[: len(root)] == root:
            return Path(mounts[prefix], *parts[len(root) :])
    raise JobPathError(f"not under a mount this node serves ({', '.join(sorted(mounts))})")


class PathProbe(Protocol):
    def is_dir(self, path: Path) -> bool:
        """Whether ``path`` is a directory here: False when nothing (or a file) is there; OSError or ValueError when
        it cannot be checked (name too long, permission denied, a symbolic link loop, a NUL byte)."""
        ...


class LocalDisk:
    def is_dir(self, path: Path) -> bool:
        # Not Path.is_dir: it answers False for some failures (a link loop) and raises for others (name too long).
        try:
            return stat.S_ISDIR(os.stat(path).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False


def look(job_path: str, mounts: Mapping[str, str], disk: PathProbe) -> Look:
    """Whether a job path is a directory here, through ``disk``; the path's error when this node does not serve it
    (then nothing is looked at) or the look fails. Never raises for one path's sake."""
    try:
        local = confine(job_path, mounts)
    except JobPathError as exc:
        return not_served(exc)
    try:
        return disk.is_dir(local)
    except (OSError, ValueError) as exc:
        return unreadable(exc)
