"""The topic catalogue: every topic Shardyard uses, its partitions, its key, the events it carries and how long the
broker keeps them.

Retention follows what reads a topic. A topic that services rebuild their state from, from its beginning (the
lifecycle, assignments, shard events, leadership claims), is kept whole: it grows with the work done, never with
idle uptime. What only the present needs is kept for a window (heartbeats, dead letters, submissions once admitted);
what only the latest value per key matters of is compacted (node state, links, the spare ratio, the queues). Kafka
drops and compacts whole closed segments only, so each bounded topic also closes its segment on time
(``segment.ms``): an idle cluster's log stops growing once its windows are full.
"""

from dataclasses import dataclass, field
from types import MappingProxyType, UnionType
from typing import Annotated, Any, Final, Union, get_args, get_origin

from aiokafka.partitioner import murmur2

from shardyard.events import (
    AlertEvent,
    AssignmentEvent,
    ElasticityEvent,
    Event,
    HeartbeatEvent,
    JobLifecycleEvent,
    LeadershipClaimed,
    LinkMeasured,
    NodeLost,
    NodeState,
    QueuesConfigured,
    RedundancyChanged,
    ServiceEvent,
    ShardEvent,
)

HOUR: Final = 3_600_000
DAY: Final = 24 * HOUR


@dataclass(frozen=True)
class Topic:
    name: str
    partitions: int
    key: str
    payload: Any = field(compare=False, repr=False, default=None)
    """The event type (or discriminated union) of the topic; None for raw bytes."""
    compacted: bool = False
    """Only the latest record per key is kept (once its segment closed)."""
    retention_ms: int | None = None
    """Records older than this are deleted (with their segment); None: kept for as long as the topic lives."""
    max_record_bytes: int = 1024 * 1024 + 12
    """The largest record batch the broker takes (Kafka's ``max.message.bytes``; its default): a producer sending a
    larger one gets ``MESSAGE_TOO_LARGE``, and nothing enters the log."""

    @property
    def configs(self) -> dict[str, str]:
        """The topic's configuration at the broker (set when it is created; ``ensure_topics`` puts it right on an
        existing topic too)."""
        # The broker stamps each record with its own clock: a replay's time is when it was played back, whatever its
        # client says (``bus.seal`` judges a sealed record's freshness by it).
        limit = {"max.message.bytes": str(self.max_record_bytes), "message.timestamp.type": "LogAppendTime"}
        if self.compacted:
            return {"cleanup.policy": "compact", "segment.ms": str(HOUR), "min.compaction.lag.ms": "0", **limit}
        if self.retention_ms is None:
            return {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1", **limit}
        segment = max(60_000, min(HOUR, self.retention_ms // 6))
        return {"cleanup.policy": "delete", "retention.ms": str(self.retention_ms), "segment.ms": str(segment), **limit}

    @property
    def events(self) -> tuple[type[Event], ...]:
        """The event types the topic carries, read off its payload: the one place that says which topic an event
        goes on (the codec routes by it)."""
        return _members(self.payload)


def _members(payload: Any) -> tuple[type[Event], ...]:
    """The event types of ``payload``: an event type, a union of them, or either annotated (a discriminator)."""
    if payload is None:
        return ()
    if get_origin(payload) is Annotated:
        return _members(get_args(payload)[0])
    if get_origin(payload) in (Union, UnionType):
        return tuple(member for arg in get_args(payload) for member in _members(arg))
    return (payload,)


SUBMISSIONS: Final = Topic("shardyard.jobs.submissions", 4, "task_id (raw user JSON)", retention_ms=7 * DAY)
"""What users sent: the queue admits each within seconds (its verdict, with the job, is on the lifecycle). A document
over the queue's limit (256 KiB) is refused ``TOO_LARGE`` by the queue; one over the record limit (1 MiB) by the
broker, at the door."""
LIFECYCLE: Final = Topic("shardyard.jobs.lifecycle", 4, "job id", JobLifecycleEvent)
HEARTBEATS: Final = Topic("shardyard.nodes.heartbeats", 16, "node id", HeartbeatEvent, retention_ms=HOUR)
"""The busiest topic (a message a node a second): its partitions bound how many resource-pool replicas share it.
Only the present matters: a node's inventory travels again every 10 s, and its state is on ``NODE_STATE``."""
NODE_STATE: Final = Topic("shardyard.nodes.state", 4, "node id", NodeState, compacted=True)
ASSIGNMENTS: Final = Topic("shardyard.assignments", 4, "node id", AssignmentEvent)
SHARD_EVENTS: Final = Topic("shardyard.shards.events", 4, "job id", ShardEvent)
FAILURES: Final = Topic("shardyard.failures", 4, "node id", NodeLost)
SERVICES: Final = Topic("shardyard.services", 1, "service name", ServiceEvent)
LEADERSHIP: Final = Topic("shardyard.leadership", 1, "service name", LeadershipClaimed)
"""Leader election: one consumer group per service; the member holding the one partition leads."""
ELASTICITY: Final = Topic("shardyard.elasticity", 1, "GPU model or node id", ElasticityEvent)
REDUNDANCY: Final = Topic("shardyard.redundancy", 1, "policy", RedundancyChanged, compacted=True)
ALERTS: Final = Topic("shardyard.alerts", 1, "alert rule/subject", AlertEvent, retention_ms=30 * DAY)
"""The monitor's alerts firing and resolved: one partition, so every replica folds one history in one order."""
LINKS: Final = Topic("shardyard.links", 4, "node id|peer id", LinkMeasured, compacted=True)
"""Agents' link measurements (RTT, bandwidth), the latest per ordered node pair."""
QUEUES: Final = Topic("shardyard.queues", 1, "queues", QueuesConfigured, compacted=True)
"""The cluster's queue configuration (``shardyard.quotas``): the latest one, read from the queues file."""
DEADLETTER: Final = Topic("shardyard.deadletter", 1, "source key (raw bytes, error in headers)", retention_ms=7 * DAY)

CATALOGUE: Final = (
    SUBMISSIONS,
    LIFECYCLE,
    HEARTBEATS,
    NODE_STATE,
    ASSIGNMENTS,
    SHARD_EVENTS,
    FAILURES,
    SERVICES,
    LEADERSHIP,
    ELASTICITY,
    REDUNDANCY,
    ALERTS,
    LINKS,
    QUEUES,
    DEADLETTER,
)

DEAD_LETTERED_BY: Final = MappingProxyType(
    {
        # Read by one member of each service's group, each record once: that member answers or dead-letters it.
        SUBMISSIONS.name: "queue",
        HEARTBEATS.name: "resource-pool",
        SHARD_EVENTS.name: "fault-manager",
        FAILURES.name: "fault-manager",
    }
)
"""Who dead-letters a topic's bad records (undecodable, forged, replayed), so that each gets one dead letter however
many read it; every other reader skips it and counts it (``shardyard_events_rejected_total``). A topic no service
reads in a group (each agent reads assignments in a group of its own, every replica follows the rest) is the
monitor's, whose replicas share its partitions (``MonitorSettings.dead_letter_share``)."""
MONITOR_LETTERS: Final = "monitor"


def dead_letterer(topic: str) -> str:
    """The service whose readers dead-letter ``topic``'s bad records (see :data:`DEAD_LETTERED_BY`)."""
    return DEAD_LETTERED_BY.get(topic, MONITOR_LETTERS)


BY_NAME: Final = {topic.name: topic for topic in CATALOGUE}


def partition_of(key: str, topic: Topic) -> int:
    """The partition of ``topic`` that a record keyed ``key`` goes to: Kafka's default partitioner (murmur2 of the
    key, as aiokafka and the Java client compute it), which every Shardyard producer uses."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % topic.partitions
