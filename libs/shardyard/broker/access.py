"""Who may do what at the broker: the principals of a secured Shardyard Kafka and their ACLs, in one table, applied
to the local broker ``shardyard up`` starts and to the compose cluster's (``broker.compose``).

- **Each service** (``queue``, ``scheduler``, ``resource-pool``, ``fault-manager``, ``monitor``, ``accounting``,
  ``autoscaler``, one principal per service, shared by its replicas) reads every topic and writes the internal ones
  (the queue also writes submissions: it forwards one read on another partition than its job's), and joins only its
  own consumer groups (``shardyard-SERVICE``, ``shardyard-SERVICE-leader``): no other principal can take a
  service's leadership or its partitions. The monitor may also describe every group (who holds a leadership).
- **The agents** (``node-agent``) write only what an agent publishes (``bus.seal.AGENT_EVENTS``: heartbeats,
  leases, shard events, link measurements), their announcement and dead letters; they read their assignments, the
  lifecycle, the node states and links; they join only ``shardyard-agent-*`` groups.
- **Each team** (``team.NAME``, one per team of the credentials file) writes submissions, and nothing else: it
  reads no topic and joins no group.
- **The admin** (``admin``) is the broker's super user: it creates topics, manages credentials and ACLs, and
  sends the operator's commands (drain, cancel).

Whatever is not granted here is refused: the broker runs with ``allow.everyone.if.no.acl.found=false``.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

from shardyard.bus.codec import topic_of_type
from shardyard.bus.seal import AGENT, AGENT_EVENTS, SERVICE_ROLES
from shardyard.bus.topics import (
    ASSIGNMENTS,
    CATALOGUE,
    DEADLETTER,
    LIFECYCLE,
    LINKS,
    NODE_STATE,
    SERVICES,
    SUBMISSIONS,
    Topic,
)

ADMIN: Final = "admin"
TEAM_PREFIX: Final = "team."
TOPIC_PREFIX: Final = "shardyard."
GROUP_PREFIX: Final = "shardyard-"
AGENT_GROUPS: Final = "shardyard-agent-"

Operation = Literal["READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"]


@dataclass(frozen=True)
class Grant:
    principal: str
    resource: Literal["topic", "group"]
    name: str
    operations: tuple[Operation, ...]
    prefixed: bool = False
    """``name`` is a prefix: every topic or group whose name starts with it."""


def team_principal(team: str) -> str:
    """The Kafka principal of a team of the credentials file."""
    return f"{TEAM_PREFIX}{team}"


def service_group(service: str) -> str:
    """The prefix of every consumer group of ``service`` (its work split and its leadership)."""
    return f"{GROUP_PREFIX}{service}"


SERVICES_WITH_GROUPS: Final = tuple(sorted(SERVICE_ROLES))
AGENT_WRITES: Final[tuple[Topic, ...]] = (
    *dict.fromkeys(topic_of_type(event) for event in AGENT_EVENTS),
    SERVICES,  # its own announcement
    DEADLETTER,  # what it cannot decode or refuses
)
AGENT_READS: Final[tuple[Topic, ...]] = (ASSIGNMENTS, LIFECYCLE, NODE_STATE, LINKS)


def principals(teams: Iterable[str]) -> list[str]:
    """Every principal of a cluster with these teams: the admin, each service, the agents, each team."""
    return [ADMIN, *SERVICES_WITH_GROUPS, AGENT, *sorted({team_principal(team) for team in teams})]


def grants(teams: Iterable[str]) -> list[Grant]:
    """Every ACL of a cluster with these teams (the admin needs none: it is the super user)."""
    internal = [topic for topic in CATALOGUE if topic is not SUBMISSIONS]
    found: list[Grant] = []
    for service in SERVICES_WITH_GROUPS:
        found.append(Grant(service, "topic", TOPIC_PREFIX, ("READ", "DESCRIBE", "DESCRIBE_CONFIGS"), prefixed=True))
        writes = [*internal, SUBMISSIONS] if service == "queue" else internal
        found += [Grant(service, "topic", topic.name, ("WRITE",)) for topic in writes]
        found.append(Grant(service, "group", service_group(service), ("READ",), prefixed=True))
    # The monitor asks who holds each leader group's partition (NO_LEADER, LEADERSHIP_HIJACKED): it describes, never
    # joins, the other services' groups.
    found.append(Grant("monitor", "group", GROUP_PREFIX, ("DESCRIBE",), prefixed=True))
    found += [Grant(AGENT, "topic", topic.name, ("WRITE", "DESCRIBE")) for topic in AGENT_WRITES]
    found += [Grant(AGENT, "topic", topic.name, ("READ", "DESCRIBE")) for topic in AGENT_READS]
    found.append(Grant(AGENT, "group", AGENT_GROUPS, ("READ",), prefixed=True))
    for team in sorted(set(teams)):
        found.append(Grant(team_principal(team), "topic", SUBMISSIONS.name, ("WRITE", "DESCRIBE")))
    return found
