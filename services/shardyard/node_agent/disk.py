"""The node's output disk (the filesystem job outputs and checkpoints map to): its free space for the heartbeat, and
what a shard's end says about it. Pure, but for :func:`measure`, which asks the OS (``statvfs``).

A shard fails DISK_FULL or IO_ERROR when

- the built-in runner says so: its exit code, and its last report over the progress pipe naming the path and the
  space left (the log may be on the disk that filled, and then says nothing);
- or a process that exited unexplained (a user's script: ``OSError: [Errno 28] No space left on device: '...'``
  and exit 1) printed a storage error in its last log lines;
- or it exited unexplained while the node's output disk had under 1 MiB free
  (:data:`~shardyard.training.storage.NEARLY_FULL_BYTES`): most likely what it died of, and a retry on the same disk
  would die alike.

A job moved off a full disk may resume from a checkpoint that the full disk holds, on a mount that is not shared: the
node it moved to cannot have it (:func:`resume_here`).
"""

from collections.abc import Iterable, Mapping
from dataclasses import replace

from shardyard.events import DiskSpace, FailureCause, ShardAssignment
from shardyard.node_agent.artifacts import is_shared
from shardyard.node_agent.environment import ShardPaths
from shardyard.node_agent.mounts import resolve
from shardyard.training.exitcodes import ExitCause
from shardyard.training.storage import Space, StorageFault, describe, fault_in_text, free_space, nearly_full

DEFAULT_OUTPUT_PATH = "/data/checkpoints"
"""The job path of job outputs and checkpoints: the scheduler's ``--checkpoint-root``."""

_CAUSES = {StorageFault.DISK_FULL: FailureCause.DISK_FULL, StorageFault.IO_ERROR: FailureCause.IO_ERROR}
_BY_EXIT = {ExitCause.DISK_FULL: FailureCause.DISK_FULL, ExitCause.IO_ERROR: FailureCause.IO_ERROR}


def measure(output_path: str, mounts: Mapping[str, str]) -> DiskSpace | None:
    """The free space of the filesystem ``output_path`` (a job path) maps to on this node; None when it cannot be
    measured."""
    space = free_space(resolve(output_path, mounts))
    if space is None:
        return None
    return DiskSpace(path=output_path, free_bytes=space.free_bytes, total_bytes=space.total_bytes)


def storage_failure(
    exit_cause: ExitCause, returncode: int, message: str, final: Mapping[str, object], space: Space | None
) -> tuple[FailureCause, str] | None:
    """The storage fault a shard's end is, with the message it is reported with; None when it is none. ``message``
    is the agent's (``exit code N: <log tail>``), ``final`` the shard's last report, ``space`` the free space of its
    output directory's disk as it exited (None: not measured)."""
    if exit_cause in _BY_EXIT:
        said = final.get("message") if final.get("kind") == "failed" else None
        return _BY_EXIT[exit_cause], f"exit code {returncode}: {said}" if isinstance(said, str) else message
    if exit_cause is not ExitCause.PROCESS_EXIT:
        return None
    found = fault_in_text(message)
    if found is not None:
        fault, path = found
        return _CAUSES[fault], f"{describe(fault, None, path, space)}; {message}"
    if nearly_full(space):
        assert space is not None
        return FailureCause.DISK_FULL, f"the output disk was full when it exited ({space.describe()}); {message}"
    return None


def resume_here(assignment: ShardAssignment, paths: ShardPaths, shared: Iterable[str]) -> tuple[ShardPaths, str | None]:
    """The shard's paths, less a resume checkpoint that cannot be on this node, and why (None: nothing dropped). A
    checkpoint missing under a mount that is not shared (``--shared-mounts``) was written on another node's own disk:
    the job moved off it (a full disk), and its shard starts over from the job's pretrained model rather than fail
    MISSING_ARTIFACT, which would end the job on a cluster that has room for it. On a shared mount a missing
    checkpoint is missing for every node: it stays the shard's failure."""
    resume = assignment.workload.resume_from
    if resume is None or paths.resume is None or is_shared(resume, shared):
        return paths, None
    try:
        if paths.resume.is_dir():
            return paths, None
    except (OSError, ValueError):
        return paths, None  # cannot be looked at: the launch check says why
    why = f"checkpoint {resume} is not on this node's own disk (another node wrote it): training starts over"
    return replace(paths, resume=None), why
