"""The files and directories of a shard that only its own job may read, made so by the agent before the shard starts;
and the check that the shard's user can reach its inputs at all.

A shard under a user of its own (:mod:`.shard_users`) writes only where it was given a directory: its job's output
(checkpoints), its peer-state directory and its private scratch (HOME, TMPDIR). The agent creates each one (its
parents stay the agent's) owned by the job's uid/gid, mode 0700, and never takes over a directory another user
owns: a job naming another job's output is refused, not handed that job's checkpoints.

One parent is shared: the built-in runner's final save replaces the whole output directory atomically, through a
sibling it creates next to it (and parks the last checkpoint there meanwhile). The output's parent, which every
job's output shares, is therefore made like ``/tmp`` (mode 1777): each job may create entries there and rename its
own, and the sticky bit keeps it from renaming or removing another's. What it creates is its own, mode 0700.

Logs stay the agent's: a shard's log is opened by the agent (mode 0600) and handed to the shard as its stdout and
stderr. A warm standby opens its shard log itself when it takes its order, so the agent creates that log beforehand,
mode 0600, owned by the job's user. A job's log directory is the agent's, mode 0710, group the job's gid: only the
job's own user may pass into it, and none may create, rename or list anything there; so the agent, reading a log's
tail as root, never follows a link a shard put in its way.

Inputs (model, dataset, working directory, the lease file's directory) need only be reachable: every directory on
the way searchable by the shard's user, the input itself readable. :func:`unreachable` says which directory is not,
so that a node set up for shards running as root (a data root inside a 0700 home directory) fails a launch with a
reason instead of a shard failing with PermissionError.

Every change is made through a file descriptor opened without following links (``O_NOFOLLOW``), so a link planted in
a path does not redirect a chown or chmod.
"""

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from shardyard.events import ShardAssignment
from shardyard.node_agent.environment import RunnerOptions, ShardPaths, peer_state_dir
from shardyard.node_agent.shard_users import ShardUser, ShardUsers

PRIVATE_DIR: Final = 0o700
SHARED_PARENT: Final = 0o1777
LOG_DIR: Final = 0o710
LOG_FILE: Final = 0o600
_SEARCH, _READ = 0o1, 0o4


@contextlib.contextmanager
def _opened(path: Path, flags: int, mode: int = 0o600) -> Iterator[int]:
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        yield fd
    finally:
        os.close(fd)


def _make_dir(path: Path, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=mode)


def own_dir(path: Path, user: ShardUser) -> None:
    """``path`` exists, a directory owned by ``user`` with mode 0700. A directory the agent owns is given to it; one
    another user owns is refused (PermissionError)."""
    _make_dir(path, PRIVATE_DIR)
    with _opened(path, os.O_RDONLY | os.O_DIRECTORY) as fd:
        found = os.fstat(fd)
        if found.st_uid not in (user.uid, os.geteuid()):
            raise PermissionError(f"{path} belongs to uid {found.st_uid}, not to this job's uid {user.uid}")
        if (found.st_uid, found.st_gid) != (user.uid, user.gid):
            os.fchown(fd, user.uid, user.gid)
        if stat.S_IMODE(found.st_mode) != PRIVATE_DIR:
            os.fchmod(fd, PRIVATE_DIR)


def shared_parent(path: Path) -> None:
    """``path`` exists, a directory every shard user may create its own entries in (mode 1777). One the agent does
    not own is left as it is."""
    _make_dir(path, 0o777)
    with _opened(path, os.O_RDONLY | os.O_DIRECTORY) as fd:
        found = os.fstat(fd)
        if found.st_uid == os.geteuid() and stat.S_IMODE(found.st_mode) != SHARED_PARENT:
            os.fchmod(fd, SHARED_PARENT)


def log_dir(path: Path, user: ShardUser | None) -> None:
    """A job's log directory: the agent's; with a shard user, mode 0710 and that user's group (only it may pass)."""
    _make_dir(path, LOG_DIR if user is not None else 0o777)
    if user is None:
        return
    with _opened(path, os.O_RDONLY | os.O_DIRECTORY) as fd:
        found = os.fstat(fd)
        if found.st_gid != user.gid:
            os.fchown(fd, -1, user.gid)
        if stat.S_IMODE(found.st_mode) != LOG_DIR:
            os.fchmod(fd, LOG_DIR)


def open_log(path: Path) -> int:
    """The shard's log, opened for appending by the agent (created mode 0600; an older one made 0600): the
    descriptor the shard writes through."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, LOG_FILE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != LOG_FILE:
            os.fchmod(fd, LOG_FILE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def give_log(path: Path, user: ShardUser | None) -> None:
    """Create the log a standby opens itself when it takes its order: mode 0600, owned by ``user`` (None: the
    agent)."""
    with _opened(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, LOG_FILE) as fd:
        if user is not None:
            os.fchown(fd, user.uid, user.gid)
        os.fchmod(fd, LOG_FILE)


def _allows(found: os.stat_result, user: ShardUser, bits: int) -> bool:
    if found.st_uid == user.uid:
        shift = 6
    elif found.st_gid == user.gid:
        shift = 3
    else:
        shift = 0
    return (found.st_mode >> shift) & bits == bits


def unreachable(path: Path, user: ShardUser, *, read: bool = True) -> str | None:
    """Why ``user`` (with no supplementary groups) cannot reach ``path``: the first directory on its way it may not
    search, or ``path`` itself it may not read and search (``read``; a file: read and execute); None when it can.
    ACLs are not looked at; a path that cannot be looked at is left to the shard to fail on."""
    real = Path(os.path.realpath(path))
    for directory in (*reversed(real.parents), real):
        try:
            found = os.stat(directory)
        except OSError:
            return None
        need = _READ | _SEARCH if read and directory == real else _SEARCH
        if not _allows(found, user, need):
            mode = stat.filemode(found.st_mode)
            return f"{directory} is {mode}, owner {found.st_uid}:{found.st_gid}"
    return None


def interpreter_unreachable(executable: Path, stdlib: Path, user: ShardUser) -> str | None:
    """Why ``user`` cannot run the interpreter shards are started with (its executable and its standard library);
    None when it can. A Python installed under a 0700 home directory (pyenv in ``/root``) is the usual cause."""
    for path in (executable, stdlib):
        why = unreachable(path, user)
        if why is not None:
            return f"{path}: {why}"
    return None


@dataclass(frozen=True)
class ShardFiles:
    """Where this node's shards write, and the making of it before each launch."""

    users: ShardUsers
    runner: RunnerOptions
    scratch_dir: Path | None = None
    """Each job's private HOME and TMPDIR here, ``<scratch_dir>/<job>``, for shards under a user of their own."""

    def home(self, job_id: str, user: ShardUser | None) -> Path | None:
        """The job's private HOME/TMPDIR; None when its shards run as the agent (they keep the agent's)."""
        return None if user is None or self.scratch_dir is None else self.scratch_dir / job_id

    def of_job(self, job_id: str) -> list[Path]:
        """What the node keeps for a job while it lives (its peer state, its private home): removed at its end."""
        kept = [peer_state_dir(self.runner, job_id), self.home(job_id, self.users.of(job_id))]
        return [path for path in kept if path is not None]

    def blocked(self, paths: ShardPaths, user: ShardUser | None) -> str | None:
        """Why the shard's user cannot reach one of its inputs or the agent's lease file; None when it can."""
        if user is None:
            return None
        inputs = [("model", paths.model), ("dataset", paths.dataset), ("checkpoint", paths.resume)]
        inputs.append(("working_dir", paths.workdir))
        for name, path in inputs:
            why = None if path is None else unreachable(path, user)
            if why is not None:
                return f"the {name} {path} is out of reach of the shard's user (uid {user.uid}): {why}"
        lease = self.runner.lease_file
        why = None if lease is None else unreachable(Path(lease).parent, user, read=False)
        if why is not None:
            return f"the agent's lease file {lease} is out of reach of the shard's user (uid {user.uid}): {why}"
        return None

    def prepare(self, assignment: ShardAssignment, paths: ShardPaths, log: Path, user: ShardUser | None) -> None:
        """Before a launch: the output's parent and the log's directory; for a shard under a user of its own, also
        its output, its peer state and the output's shared parent (the built-in runner's) and its private home."""
        paths.output.parent.mkdir(parents=True, exist_ok=True)
        log_dir(log.parent, user)
        if user is None:
            return
        runner = assignment.workload.entrypoint is None
        if runner:
            shared_parent(paths.output.parent)
        own_dir(paths.output, user)
        peers = peer_state_dir(self.runner, assignment.job_id)
        if peers is not None and runner:
            own_dir(peers, user)
        self.prepare_home(assignment.job_id, user)

    def prepare_standby(self, job_id: str, log: Path, user: ShardUser | None) -> None:
        log_dir(log.parent, user)
        self.prepare_home(job_id, user)

    def prepare_home(self, job_id: str, user: ShardUser | None) -> None:
        home = self.home(job_id, user)
        if home is not None and user is not None:
            own_dir(home, user)
