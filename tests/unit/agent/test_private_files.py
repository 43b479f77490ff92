"""The directories a shard writes are its job's user's alone, its logs the agent's (0600), and an input out of the
shard user's reach is named before anything starts. Changing owners takes root: those tests skip without it."""

import os
import stat
from pathlib import Path

import pytest

from shardyard.node_agent.private_files import give_log, log_dir, open_log, own_dir, shared_parent, unreachable
from shardyard.node_agent.shard_users import ShardUser
from tests.support.cluster import reachable_by_shards

USER = ShardUser(uid=231_234, gid=231_234)
OTHER = ShardUser(uid=231_999, gid=231_999)
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def owner(path: Path) -> tuple[int, int]:
    found = os.lstat(path)
    return found.st_uid, found.st_gid


@root_only
def test_a_new_private_dir_is_the_users_alone_and_its_parents_the_agents(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints" / "job-a"

    own_dir(path, USER)

    assert (owner(path), mode(path)) == ((USER.uid, USER.gid), 0o700)
    assert owner(path.parent) == (os.geteuid(), os.getegid())


@root_only
def test_an_existing_dir_of_the_agents_is_given_to_the_user(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.mkdir(mode=0o755)

    own_dir(path, USER)
    own_dir(path, USER)  # again: nothing changes

    assert (owner(path), mode(path)) == ((USER.uid, USER.gid), 0o700)


@root_only
def test_another_jobs_dir_is_never_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "out"
    own_dir(path, OTHER)

    with pytest.raises(PermissionError, match=f"belongs to uid {OTHER.uid}"):
        own_dir(path, USER)

    assert owner(path) == (OTHER.uid, OTHER.gid)


def test_a_link_in_place_of_the_dir_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    (tmp_path / "out").symlink_to(target)

    with pytest.raises(OSError):
        own_dir(tmp_path / "out", USER)

    assert mode(target) == 0o755 and owner(target) == (os.geteuid(), os.getegid())


def test_the_shared_parent_of_outputs_is_like_tmp_and_only_if_it_is_the_agents(tmp_path: Path) -> None:
    shared_parent(tmp_path / "checkpoints")

    assert mode(tmp_path / "checkpoints") == 0o1777


@root_only
def test_a_shared_parent_someone_else_owns_is_left_alone(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER.uid, OTHER.gid)

    shared_parent(theirs)

    assert mode(theirs) == 0o755


@root_only
def test_a_jobs_log_dir_lets_only_its_user_pass(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "job-a"

    log_dir(path, USER)

    assert (owner(path), mode(path)) == ((os.geteuid(), USER.gid), 0o710)


def test_without_a_shard_user_the_log_dir_is_as_before(tmp_path: Path) -> None:
    log_dir(tmp_path / "logs" / "job-a", None)

    assert (tmp_path / "logs" / "job-a").is_dir()


def test_the_agent_opens_logs_0600_and_makes_older_ones_so(tmp_path: Path) -> None:
    old = tmp_path / "old.log"
    old.write_text("before\n")
    old.chmod(0o644)

    for path in (tmp_path / "job" / "new.log", old):
        os.close(open_log(path))
        assert mode(path) == 0o600

    assert old.read_text() == "before\n"  # appended to, not truncated


@root_only
def test_a_standbys_log_is_made_for_its_user(tmp_path: Path) -> None:
    path = tmp_path / "shard-0-attempt-1.log"

    give_log(path, USER)

    assert (owner(path), mode(path)) == ((USER.uid, USER.gid), 0o600)


@pytest.mark.parametrize(
    ("parent_mode", "target_mode", "read", "blocked_by"),
    [
        pytest.param(0o711, 0o755, True, None, id="searchable-and-readable"),
        pytest.param(0o700, 0o755, True, "parent", id="a-closed-parent"),
        pytest.param(0o711, 0o711, True, "target", id="searchable-not-readable"),
        pytest.param(0o711, 0o711, False, None, id="search-is-enough-for-a-lease"),
    ],
)
def test_unreachable_names_the_directory_in_the_way(
    tmp_path: Path, parent_mode: int, target_mode: int, read: bool, blocked_by: str | None
) -> None:
    parent = tmp_path / "parent"
    target = parent / "target"
    target.mkdir(parents=True)
    target.chmod(target_mode)
    parent.chmod(parent_mode)
    reachable_by_shards(tmp_path)

    why = unreachable(target, USER, read=read)

    if blocked_by is None:
        assert why is None
    else:
        in_the_way = parent if blocked_by == "parent" else target
        assert why is not None and why.startswith(f"{in_the_way} is d"), why


def test_the_users_own_dir_is_reachable_whatever_others_may(tmp_path: Path) -> None:
    target = tmp_path / "mine"
    target.mkdir(mode=0o700)
    reachable_by_shards(tmp_path)
    me = ShardUser(uid=os.geteuid(), gid=os.getegid())

    assert unreachable(target, me) is None
    assert unreachable(target, USER) is not None
