"""Storage faults: a shard that failed because a disk was full or failed, told apart from other failures by the
errno, and described by the path it failed on and the space left there. Torch-free: the runner reads its own
exceptions with it (:func:`fault_of`), the node agent a script's last log lines (:func:`fault_in_text`) and the free
space of its output disk (:func:`free_space`).

A full disk and a failing one are both the node's, not the job's: retried on the same disk they fail the same way, so
they are reported as their own causes (``DISK_FULL``, ``IO_ERROR``) and the job moves (see
``shardyard.fault_manager.recovery``), where an unexplained exit would be retried in place.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

from shardyard.units import format_bytes


class StorageFault(StrEnum):
    DISK_FULL = "DISK_FULL"
    """No space left (``ENOSPC``), or the writer's quota spent (``EDQUOT``)."""
    IO_ERROR = "IO_ERROR"
    """The device failed (``EIO``), or its filesystem went read-only (``EROFS``: what ext4 and xfs do on errors)."""


ERRNOS: Final = {
    errno.ENOSPC: StorageFault.DISK_FULL,
    errno.EDQUOT: StorageFault.DISK_FULL,
    errno.EIO: StorageFault.IO_ERROR,
    errno.EROFS: StorageFault.IO_ERROR,
}

NEARLY_FULL_BYTES: Final = 1 << 20
"""An output disk with less free space than this is full for :func:`nearly_full`: a write of any size may fail."""

_PYTHON_ERROR = re.compile(r"\[Errno (\d+)\] [^:|\n]*(?:: '([^'\n]*)')?")
"""How Python prints an OSError: ``[Errno 28] No space left on device: '/data/out/model.bin'``."""
_PLAIN: Final = {
    "no space left on device": StorageFault.DISK_FULL,
    "disk quota exceeded": StorageFault.DISK_FULL,
    "input/output error": StorageFault.IO_ERROR,
    "read-only file system": StorageFault.IO_ERROR,
}
"""The same errors as C programs and shells print them (``strerror``)."""


@dataclass(frozen=True)
class Space:
    free_bytes: int
    total_bytes: int

    def describe(self) -> str:
        return f"{format_bytes(self.free_bytes)} free of {format_bytes(self.total_bytes)}"


def fault_of(exc: BaseException) -> tuple[StorageFault, OSError] | None:
    """The storage fault ``exc`` is, or was raised from (a checkpoint write wraps its OSError), with that OSError;
    None for any other failure."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in ERRNOS:
            return ERRNOS[current.errno], current
        current = current.__cause__ or current.__context__
    return None


def fault_in_text(text: str) -> tuple[StorageFault, str | None] | None:
    """The storage fault a log's lines report, with the path they name if any: a Python traceback's OSError first
    (it names the path), then the C library's wording. None when they report none."""
    for match in _PYTHON_ERROR.finditer(text):
        fault = ERRNOS.get(int(match.group(1)))
        if fault is not None:
            return fault, match.group(2)
    lowered = text.lower()
    for words, fault in _PLAIN.items():
        if words in lowered:
            return fault, None
    return None


def free_space(path: str | os.PathLike[str]) -> Space | None:
    """Free (to an unprivileged writer) and total bytes of the filesystem ``path`` is on, or would be on: the nearest
    directory that exists is measured (an output directory is made only when a shard starts). None when nothing
    can be measured."""
    for directory in (Path(path), *Path(path).parents):
        try:
            found = os.statvfs(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except (OSError, ValueError):
            return None
        return Space(found.f_bavail * found.f_frsize, found.f_blocks * found.f_frsize)
    return None


def nearly_full(space: Space | None) -> bool:
    """Whether a disk is full for every practical purpose: under :data:`NEARLY_FULL_BYTES` free."""
    return space is not None and space.free_bytes < NEARLY_FULL_BYTES


def describe(fault: StorageFault, error: OSError | None, path: str | None, space: Space | None) -> str:
    """One line for the shard's failure: what failed, on which path, and the space left there, e.g. ``no space left
    on device (ENOSPC) writing /srv/out/job-1/.checkpoint.tmp-4/model.safetensors: 0B free of 64MiB``."""
    if error is not None and error.errno is not None:
        what = f"{os.strerror(error.errno).lower()} ({errno.errorcode.get(error.errno, error.errno)})"
    else:
        what = "no space left on device" if fault is StorageFault.DISK_FULL else "input/output error"
    where = f" on {path}" if path else ""
    left = f": {space.describe()}" if space is not None else ""
    return f"{what}{where}{left}"


def path_of(error: OSError) -> str | None:
    """The path an OSError names (``filename``, or ``filename2`` of a rename), as text."""
    name = error.filename if error.filename is not None else error.filename2
    return os.fsdecode(name) if isinstance(name, str | bytes | os.PathLike) else None
