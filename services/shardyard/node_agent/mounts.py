"""Mapping of the absolute paths jobs name (``/data/models/x``) onto this node's disk, through declared mounts.

``PathProbe`` is the seam to the filesystem: whether a local directory is there (``LocalDisk`` asks the OS).
"""

from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Protocol

from shardyard.errors import ConfigError


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
    """The local path of ``job_path``: the longest mounted prefix is replaced; unmapped paths are used as they are."""
    path = PurePosixPath(job_path)
    for prefix in sorted(mounts, key=len, reverse=True):
        root = PurePosixPath(prefix)
        if path == root or root in path.parents:
            return Path(mounts[prefix]) / path.relative_to(root)
    return Path(job_path)


class PathProbe(Protocol):
    def is_dir(self, path: Path) -> bool:
        """Whether ``path`` is a directory here (False when it cannot be checked)."""
        ...


class LocalDisk:
    def is_dir(self, path: Path) -> bool:
        return path.is_dir()
