"""Who a shard runs as: a stable uid/gid per job in the operator's range when the agent is root; the agent's own user
when told so or when it cannot switch; a named user for every shard."""

import pytest

from shardyard.errors import ConfigError
from shardyard.node_agent.shard_users import ShardUser, ShardUsers, choose, job_slot, login_name

USERS = {"shard": (5000, 5001), "root": (0, 0)}


def lookup(name: str) -> tuple[int, int]:
    return USERS[name]


def test_a_job_has_one_uid_everywhere_in_the_range() -> None:
    users = ShardUsers(base=200_000, count=65_536)

    a = users.of("job-a")

    assert a == users.of("job-a") == ShardUsers(base=200_000, count=65_536).of("job-a")
    assert a is not None and a.uid == a.gid and 200_000 <= a.uid < 265_536
    assert a != users.of("job-b")


def test_the_slot_is_a_stable_hash_not_pythons() -> None:
    # sha256, pinned: every node and every Python process computes the same uid for a job.
    assert job_slot("job-a", 65_536) == 0x059D  # the low 16 bits of sha256("job-a")'s first 8 bytes
    assert {job_slot(f"job-{i}", 7) for i in range(200)} == set(range(7))


@pytest.mark.parametrize(
    ("setting", "agent_uid", "expected"),
    [
        pytest.param("job", 0, ShardUsers(base=200_000, count=10), id="root-per-job"),
        pytest.param("job", 1000, ShardUsers(), id="not-root-cannot-switch"),
        pytest.param("agent", 0, ShardUsers(), id="root-turned-off"),
        pytest.param("agent", 1000, ShardUsers(), id="not-root-agent"),
        pytest.param("shard", 0, ShardUsers(fixed=ShardUser(5000, 5001)), id="root-named-user"),
        pytest.param("6000", 0, ShardUsers(fixed=ShardUser(6000, 6000)), id="root-numeric-uid"),
        pytest.param("shard", 5000, ShardUsers(), id="named-user-is-the-agent"),
        pytest.param("root", 0, ShardUsers(), id="root-named-root"),
    ],
)
def test_the_setting(setting: str, agent_uid: int, expected: ShardUsers) -> None:
    assert choose(setting, base=200_000, count=10, agent_uid=agent_uid, lookup=lookup) == expected


@pytest.mark.parametrize(
    ("setting", "agent_uid", "says"),
    [
        pytest.param("nobody-here", 0, "no such user", id="unknown-user"),
        pytest.param("shard", 1000, "only an agent running as root", id="named-user-without-root"),
    ],
)
def test_a_dedicated_user_that_cannot_be_had_is_a_config_error(setting: str, agent_uid: int, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        choose(setting, base=200_000, count=10, agent_uid=agent_uid, lookup=lookup)


def test_as_the_agent_nobody_is_switched_to() -> None:
    assert ShardUsers().of("job-a") is None and not ShardUsers().isolated
    assert ShardUsers(fixed=ShardUser(5000, 5001)).of("job-a") == ShardUser(5000, 5001)


def test_a_user_is_named_by_the_user_database_else_by_its_uid() -> None:
    names = {1001: "trainer"}

    def lookup(uid: int) -> str:
        return names[uid]  # KeyError for a uid with no entry, as pwd.getpwuid

    assert login_name(ShardUser(uid=1001, gid=1001), lookup) == "trainer"
    assert login_name(ShardUser(uid=262959, gid=262959), lookup) == "shard-262959"
