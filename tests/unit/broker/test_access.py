"""The ACL table of a secured broker (``shardyard.broker.access``): who may write what, and who may join which
consumer group. The broker enforces it (tests/e2e/test_broker_security.py); these rules keep the table honest."""

import pytest

from shardyard.broker.access import (
    ADMIN,
    AGENT_READS,
    AGENT_WRITES,
    SERVICES_WITH_GROUPS,
    Grant,
    grants,
    principals,
    team_principal,
)
from shardyard.bus.leadership import group_of
from shardyard.bus.seal import AGENT
from shardyard.bus.topics import CATALOGUE, SUBMISSIONS

TEAMS = ("ml", "vision")
TABLE = grants(TEAMS)


def allows(principal: str, resource: str, name: str, operation: str) -> bool:
    def covers(grant: Grant) -> bool:
        return grant.name == name or (grant.prefixed and name.startswith(grant.name))

    return any(
        g.principal == principal and g.resource == resource and operation in g.operations and covers(g) for g in TABLE
    )


def test_every_principal_once_and_the_admin_needs_no_grant() -> None:
    names = principals(TEAMS)
    assert len(names) == len(set(names)) == 1 + len(SERVICES_WITH_GROUPS) + 1 + len(TEAMS)
    assert all(grant.principal in names for grant in TABLE)
    assert not any(grant.principal == ADMIN for grant in TABLE)  # the super user


@pytest.mark.parametrize("team", TEAMS)
def test_a_team_writes_submissions_and_nothing_else(team: str) -> None:
    who = team_principal(team)
    assert [(g.resource, g.name, g.operations) for g in TABLE if g.principal == who] == [
        ("topic", SUBMISSIONS.name, ("WRITE", "DESCRIBE"))
    ]


@pytest.mark.parametrize("service", SERVICES_WITH_GROUPS)
def test_only_a_service_joins_its_leadership_group(service: str) -> None:
    group = group_of(service)
    joiners = {p for p in principals(TEAMS) if allows(p, "group", group, "READ")}
    assert joiners == {service}


def test_every_internal_topic_is_written_by_a_service_and_read_by_every_service() -> None:
    for topic in CATALOGUE:
        writers = {s for s in SERVICES_WITH_GROUPS if allows(s, "topic", topic.name, "WRITE")}
        assert writers, topic.name
        assert all(allows(s, "topic", topic.name, "READ") for s in SERVICES_WITH_GROUPS), topic.name
    assert {s for s in SERVICES_WITH_GROUPS if allows(s, "topic", SUBMISSIONS.name, "WRITE")} == {"queue"}


def test_agents_write_only_what_agents_publish_and_join_only_agent_groups() -> None:
    written = {topic.name for topic in CATALOGUE if allows(AGENT, "topic", topic.name, "WRITE")}
    assert written == {topic.name for topic in AGENT_WRITES}
    assert SUBMISSIONS.name not in written
    assert {topic.name for topic in CATALOGUE if allows(AGENT, "topic", topic.name, "READ")} == {
        topic.name for topic in AGENT_READS
    }
    assert not any(allows(AGENT, "group", group_of(service), "READ") for service in SERVICES_WITH_GROUPS)
    assert allows(AGENT, "group", "shardyard-agent-node-7", "READ")
