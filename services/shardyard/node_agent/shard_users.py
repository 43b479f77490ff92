"""Who a shard runs as, pure: the agent's setting and its own uid in, a uid/gid per job out.

Shards run users' code. Run as the agent's user (root, on most nodes), a shard could read every other job's
environment (``/proc/<pid>/environ``: its tokens), checkpoints and logs, and the agent's own files. So an agent that
runs as root starts each job's shards under a uid/gid of the job's own, with no supplementary groups and a umask of
0o077: other jobs' processes, files and logs are then another user's, closed to it. Every shard of a job, on every
node, computes the same uid (a stable hash of the job id into the operator's range), so a gang's shards share their
checkpoints, peer state and output directory, across attempts and nodes, without a user database or coordination.

``--shard-user`` chooses:

- ``job`` (the default): a uid and gid per job, ``shard_uid_base + sha256(job_id) % shard_uid_count`` (the same
  number for both); no passwd entry is needed. Two jobs whose ids hash alike share a uid, so the range should be
  large against the number of jobs alive at once (65536 by default: among 100 live jobs, two share a uid with odds of
  7 %);
- ``agent``: the agent's own user, as before (no isolation). An agent that is not root has no choice: it cannot
  switch users, so ``job`` means ``agent`` there;
- a user name (or a numeric uid): every shard as that dedicated user, with its primary group. That keeps shards away
  from the agent's files, not from each other's.
"""

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from shardyard.errors import ConfigError

PER_JOB: Final = "job"
AS_AGENT: Final = "agent"
DEFAULT_UID_BASE: Final = 200_000
DEFAULT_UID_COUNT: Final = 65_536
UMASK: Final = 0o077
"""What a shard under a user of its own creates is its user's alone (others need not read a job's outputs)."""


@dataclass(frozen=True)
class ShardUser:
    uid: int
    gid: int


@dataclass(frozen=True)
class ShardUsers:
    """The node's choice: a user per job (``base``/``count``), one fixed user (``fixed``), or none (as the agent)."""

    base: int = 0
    count: int = 0
    fixed: ShardUser | None = None

    @property
    def isolated(self) -> bool:
        """Whether shards run as some user other than the agent's."""
        return self.count > 0 or self.fixed is not None

    def of(self, job_id: str) -> ShardUser | None:
        """The user ``job_id``'s shards run as; None: the agent's own."""
        if self.fixed is not None:
            return self.fixed
        if self.count <= 0:
            return None
        uid = self.base + job_slot(job_id, self.count)
        return ShardUser(uid=uid, gid=uid)


def login_name(user: ShardUser, lookup: Callable[[int], str]) -> str:
    """The name ``user`` goes by: its name in the user database (``lookup``: a uid -> its name, KeyError when it has
    none, as ``pwd.getpwuid``), else ``shard-UID`` (a per-job uid has no entry)."""
    try:
        return lookup(user.uid)
    except KeyError:
        return f"shard-{user.uid}"


def job_slot(job_id: str, count: int) -> int:
    """A stable number in ``[0, count)`` for ``job_id``: the same on every node and in every process (Python's own
    ``hash`` of a string changes from process to process)."""
    digest = hashlib.sha256(job_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


UserLookup = Callable[[str], tuple[int, int]]
"""A user name -> its (uid, primary gid); KeyError when there is no such user (``pwd.getpwnam``)."""


def choose(setting: str, *, base: int, count: int, agent_uid: int, lookup: UserLookup) -> ShardUsers:
    """The node's :class:`ShardUsers` for ``--shard-user``, the agent running as ``agent_uid``. A named user that
    does not exist, or that a non-root agent cannot become, is a :class:`ConfigError`: an operator who asked for a
    dedicated user does not get shards running as the agent instead."""
    if setting == AS_AGENT:
        return ShardUsers()
    if setting == PER_JOB:
        return ShardUsers(base=base, count=count) if agent_uid == 0 else ShardUsers()
    user = _named(setting, lookup)
    if user.uid == agent_uid:
        return ShardUsers()
    if agent_uid != 0:
        raise ConfigError(f"shard_user {setting!r}: only an agent running as root can start shards as another user")
    return ShardUsers(fixed=user)


def _named(setting: str, lookup: UserLookup) -> ShardUser:
    if setting.isdigit():
        return ShardUser(uid=int(setting), gid=int(setting))
    try:
        uid, gid = lookup(setting)
    except KeyError as exc:
        raise ConfigError(
            f"shard_user {setting!r}: no such user (write {PER_JOB}, {AS_AGENT}, a user name or a uid)"
        ) from exc
    return ShardUser(uid=uid, gid=gid)
