"""Leadership that cannot be taken silently: NO_LEADER and LEADERSHIP_HIJACKED.

A service elected by its group (``bus.leadership``: the scheduler) leads through the member the group coordinator
gives the one leadership partition; that member proves itself with a sealed claim and announces its term
(``LeaderElected``, sealed, which the monitor folds only when its seal verifies). A client that joins the group with
the service's protocol and a large held term is given the partition instead, and then nobody leads (issue: a plain
Kafka client with no key stopped all scheduling for 45 s). On Kafka with ACLs only the service's principal may join
(``broker.access``); on a broker without them, it must at least be seen.

Every ``leadership_interval_s`` the monitor asks the group coordinator who holds each leader group's partition
(:func:`holders`) and keeps it with the time it first saw that member hold it (:class:`Holding`). A holding is
**proven** when the newest sealed ``LeaderElected`` of the service names the holder's replica and was announced no
earlier than the holding began (less :data:`SLACK_S`, the poll's own delay). Unproven, :func:`verdict` says:

- ``no_leader``: nobody holds the partition, or a sealed replica of the service holds it (its client id is that of a
  replica that announced itself sealed, and no other member uses it) but has announced no term;
- ``hijacked``: the holder is not a sealed replica: an unknown client id, or one two members share.

A verdict that lasts ``leader_proof_s`` (4 s: a failover takes about 3) fires the alert, at most a poll plus an
alert interval later: within 10 s. Its Prometheus twin reads ``shardyard_leader_unproven_since_timestamp_seconds``.
"""

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Final, Literal, Protocol

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import KafkaError

from shardyard.bus.leadership import PARTITION, group_of
from shardyard.bus.transport import client_options
from shardyard.clock import Clock
from shardyard.events import AlertRule, AlertSeverity
from shardyard.monitor.condition import Condition
from shardyard.monitor.exposition import Family
from shardyard.monitor.holding import Member, observe
from shardyard.monitor.views import ClusterView

log = logging.getLogger(__name__)

ELECTED: Final = ("scheduler",)
"""The services elected by a leader group."""
SLACK_S: Final = 5.0
"""How much earlier than the monitor saw a holding begin its leader's announcement may be (the poll's delay)."""

Verdict = Literal["no_leader", "hijacked"]


def election_client(service: str, instance: str) -> str:
    """The client id a replica's election consumer uses (``bus.leadership.Leadership``)."""
    return f"{service}-{instance}-election"


async def holders(admin: AIOKafkaAdminClient, service: str) -> list[Member]:
    """The members of ``service``'s leader group, and which holds the partition."""
    (response,) = await admin.describe_consumer_groups([group_of(service)])
    members: list[Member] = []
    for group in response.to_object()["groups"]:
        if group["group"] != group_of(service):
            continue
        for member in group["members"]:
            raw = member["member_assignment"]
            assigned = ConsumerProtocolMemberAssignment.decode(raw).assignment if raw else []
            holds = any(topic == PARTITION.topic and PARTITION.partition in parts for topic, parts in assigned)
            members.append(Member(member["member_id"], member["client_id"], member["client_host"], holds))
    return members


def verdict(view: ClusterView, service: str) -> tuple[Verdict, str] | None:
    """Why ``service``'s leadership is unproven now, and how; None when a sealed leader holds it."""
    held = view.leadership.get(service)
    if held is None:
        return None  # not asked yet
    holder = held.holder
    if holder is None:
        return "no_leader", f"no member of {group_of(service)} holds the leadership ({len(held.members)} members)"
    elected = view.leaders.get(service)
    proven = (
        elected is not None
        and holder.client_id == election_client(service, elected.instance)
        and (held.inherited or elected.occurred_at >= held.since - timedelta(seconds=SLACK_S))
    )
    sharing = sum(1 for m in held.members if m.client_id == holder.client_id)
    if proven and sharing == 1:
        return None
    replicas = {election_client(s.service, s.instance) for s in view.services.values() if s.service == service}
    if holder.client_id in replicas and sharing == 1:
        return "no_leader", f"replica {holder.client_id} holds the leadership partition but announced no sealed term"
    return "hijacked", (
        f"member {holder.client_id!r} from {holder.host} holds the leadership partition of {service} and is not one "
        f"of its sealed replicas" + (f" ({sharing} members use that client id)" if sharing > 1 else "")
    )


def no_leader(view: ClusterView, now: datetime, policy: "Bound") -> Iterator[Condition]:
    """NO_LEADER, per elected service, once its leadership has been unproven for ``leader_proof_s``."""
    return _unproven(view, now, policy, "no_leader")


def leadership_hijacked(view: ClusterView, now: datetime, policy: "Bound") -> Iterator[Condition]:
    """LEADERSHIP_HIJACKED, per elected service, once a member that is not a sealed replica held it that long."""
    return _unproven(view, now, policy, "hijacked")


def _unproven(view: ClusterView, now: datetime, policy: "Bound", wanted: Verdict) -> Iterator[Condition]:
    for service in sorted(view.leadership):
        found = verdict(view, service)
        if found is None or found[0] != wanted:
            continue
        kind, detail = found
        since = view.leadership[service].since
        age = max(0.0, (now - since).total_seconds())
        if age < policy.leader_proof_s:
            continue
        rule = AlertRule.NO_LEADER if kind == "no_leader" else AlertRule.LEADERSHIP_HIJACKED
        yield Condition(
            rule, service, AlertSeverity.CRITICAL, f"{detail}, for {age:.0f} s", age, policy.leader_proof_s, since
        )


class Bound(Protocol):
    """What the rule reads of the policy (``AlertPolicy``)."""

    @property
    def leader_proof_s(self) -> float: ...


class LeaderWatch:
    """Asks the group coordinator who holds each elected service's partition, into ``view.leadership``."""

    def __init__(self, bootstrap: str, view: ClusterView, clock: Clock, *, name: str) -> None:
        self.bootstrap = bootstrap
        self.view = view
        self.clock = clock
        self.name = name
        self._admin: AIOKafkaAdminClient | None = None

    async def tick(self) -> None:
        if self._admin is None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, client_id=self.name, **client_options())
            try:
                await admin.start()
            except BaseException:  # a broker out of reach: the next tick tries afresh, nothing left open
                await admin.close()
                raise
            self._admin = admin
        for service in ELECTED:
            try:
                members = await holders(self._admin, service)
            except (KafkaError, OSError) as exc:
                log.warning(
                    "%s: cannot describe %s (%s): its leadership is judged as last seen", self.name, service, exc
                )
                continue
            self.view.leadership[service] = observe(self.view.leadership.get(service), members, self.clock.now())

    async def stop(self) -> None:
        if self._admin is not None:
            await self._admin.close()
            self._admin = None


def leadership_family(view: ClusterView) -> Family:
    """The Prometheus twin's input: since when each unproven leadership is unproven, by verdict."""
    unproven = Family(
        "shardyard_leader_unproven_since_timestamp_seconds",
        "Unix time since which an elected service's leadership is unproven (monitor.leadership), by verdict: "
        "no_leader or hijacked; no series while a sealed leader holds it",
        ["service", "verdict"],
    )
    for service, held in sorted(view.leadership.items()):
        found = verdict(view, service)
        if found is not None:
            unproven.add((service, found[0]), held.since.timestamp())
    return unproven
