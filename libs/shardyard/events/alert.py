"""Alerts: the monitor's rules over the cluster view start (``alert.firing``) and end (``alert.resolved``).

Both go to the one-partition alerts topic keyed by ``RULE/subject``, so every monitor replica folds the same alert
history in the same order. One alert is one (rule, subject) pair; ``since`` names its episode: a resolution ends the
episode whose ``since`` it carries, and an event id made from (rule, subject, since, kind) lets any consumer drop the
duplicate that two replicas deciding the same transition at the same moment may publish.
"""

from datetime import datetime
from enum import StrEnum
from hashlib import sha256
from typing import Annotated, Literal

from pydantic import Field

from shardyard.events.base import AwareDatetime, Event


class AlertRule(StrEnum):
    """What an alert watches; each has a Prometheus twin in ``deploy/prometheus/alerts.yml``."""

    RESOURCE_SHORTAGE = "RESOURCE_SHORTAGE"
    """A job has waited for capacity (no fit, GPU model, free GPUs...) longer than the limit."""
    SYNC_TIMEOUT = "SYNC_TIMEOUT"
    """A shard of the job failed a parameter sync that exceeded the sync timeout, recently."""
    SLOW_SYNC = "SLOW_SYNC"
    """Slow parameter syncs widened the job's sync interval beyond the one it asked for."""
    NODE_SUSPECT = "NODE_SUSPECT"
    NODE_LOST = "NODE_LOST"
    GPU_OVER_TEMPERATURE = "GPU_OVER_TEMPERATURE"
    HEARTBEAT_LAG = "HEARTBEAT_LAG"
    """A node's newest heartbeat is older than the limit (before or beside SUSPECT: a slow agent or bus)."""
    CONSUMER_LAG = "CONSUMER_LAG"
    """A monitor replica reads the topics too far behind their ends: everything it shows is late."""
    NO_PROGRESS = "NO_PROGRESS"
    """A running job reported no training step for longer than the limit."""
    DEAD_LETTERS = "DEAD_LETTERS"
    """Messages of a topic went to the dead-letter topic recently: a service could not use them (a submission that
    could not be answered, an event no handler could take). Per source topic."""
    SLOW_LINK = "SLOW_LINK"
    """The measured link between two nodes is out of line with the cluster's (``shardyard.links.slow_links``): its
    RTT far above, or its bandwidth far below, what the nodes' best links show. Per node pair, ``a|b`` sorted."""
    DISK_FULL = "DISK_FULL"
    """A node's output disk (where checkpoints go) has less free space than the placement floor, or a shard failed
    DISK_FULL there recently: no new shards go there until it is cleaned up. Per node."""
    QUEUE_STARVED = "QUEUE_STARVED"
    """A team's queue has had a job that fits in its nominal quota waiting longer than the queues file's
    ``starving_after_s`` (borrowers not reclaimable yet, or capacity missing). Per queue."""
    FORGED_EVENTS = "FORGED_EVENTS"
    """Events of a topic were refused for their seal recently (``shardyard.bus.seal``): unsealed, a seal that does
    not verify, or a sealer that may not publish them. Someone without the cluster secret writes to the bus, or a
    component runs without it. Per topic."""
    NO_LEADER = "NO_LEADER"
    """A service elected by its group (the scheduler) has had no leader proven by a sealed claim for longer than the
    bound: nobody holds its leadership partition, or the replica that holds it has announced no term. Per service."""
    LEADERSHIP_HIJACKED = "LEADERSHIP_HIJACKED"
    """A member of a service's leader group that is not one of its sealed replicas holds the leadership partition (a
    client that joined the group without the service's key), for longer than the bound: while it holds it, the
    service has no leader. Per service."""
    STRAGGLER = "STRAGGLER"
    """A running job's rank takes far longer than the others for its own part of a step (``compute_ms``, its waits
    on the gang left out), for longer than the bound: the whole gang runs at its pace. Per job."""


class AlertSeverity(StrEnum):
    WARNING = "WARNING"
    CRITICAL = "CRITICAL"


def alert_key(rule: AlertRule, subject: str) -> str:
    """``RULE/subject``: the alert's identity and its partition key."""
    return f"{rule}/{subject}"


def alert_event_id(kind: str, rule: AlertRule, subject: str, since: datetime) -> str:
    """The same for the same transition decided by any replica, so duplicates are recognisable."""
    return sha256(f"{kind}|{rule}|{subject}|{since.isoformat()}".encode()).hexdigest()[:32]


class AlertFiring(Event):
    """A rule's condition holds (for its ``for`` duration, where it has one) for ``subject``."""

    type: Literal["alert.firing"] = "alert.firing"
    rule: AlertRule
    subject: str = Field(min_length=1, description="what the alert is about: a node id, a job id, node/gpu, a replica")
    severity: AlertSeverity
    summary: str = Field(description="one line for people: what is wrong and by how much")
    value: float = Field(description="the measure the rule compared: seconds, degrees, messages, a ratio")
    threshold: float = Field(description="the limit ``value`` passed")
    since: AwareDatetime = Field(description="when the condition began (data time where the data says)")


class AlertResolved(Event):
    """The condition of the alert that has fired since ``since`` no longer holds."""

    type: Literal["alert.resolved"] = "alert.resolved"
    rule: AlertRule
    subject: str = Field(min_length=1)
    severity: AlertSeverity
    summary: str
    value: float | None = Field(default=None, description="the measure now, when there still is one")
    threshold: float
    since: AwareDatetime = Field(description="the ``since`` of the firing this resolves")


AlertEvent = Annotated[AlertFiring | AlertResolved, Field(discriminator="type")]
"""What the alerts topic carries."""
