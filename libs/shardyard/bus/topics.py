"""The topic catalogue: every topic Shardyard uses, its partitions, its key and the events it carries."""

from dataclasses import dataclass, field
from types import UnionType
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


@dataclass(frozen=True)
class Topic:
    name: str
    partitions: int
    key: str
    payload: Any = field(compare=False, repr=False, default=None)
    """The event type (or discriminated union) of the topic; None for raw bytes."""
    compacted: bool = False

    @property
    def configs(self) -> dict[str, str]:
        return {"cleanup.policy": "compact"} if self.compacted else {}

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


SUBMISSIONS: Final = Topic("shardyard.jobs.submissions", 4, "task_id (raw user JSON)")
LIFECYCLE: Final = Topic("shardyard.jobs.lifecycle", 4, "job id", JobLifecycleEvent)
HEARTBEATS: Final = Topic("shardyard.nodes.heartbeats", 16, "node id", HeartbeatEvent)
"""The busiest topic (a message a node a second): its partitions bound how many resource-pool replicas share it."""
NODE_STATE: Final = Topic("shardyard.nodes.state", 4, "node id", NodeState, compacted=True)
ASSIGNMENTS: Final = Topic("shardyard.assignments", 4, "node id", AssignmentEvent)
SHARD_EVENTS: Final = Topic("shardyard.shards.events", 4, "job id", ShardEvent)
FAILURES: Final = Topic("shardyard.failures", 4, "node id", NodeLost)
SERVICES: Final = Topic("shardyard.services", 1, "service name", ServiceEvent)
LEADERSHIP: Final = Topic("shardyard.leadership", 1, "service name", LeadershipClaimed)
"""Leader election: one consumer group per service; the member holding the one partition leads."""
ELASTICITY: Final = Topic("shardyard.elasticity", 1, "GPU model or node id", ElasticityEvent)
REDUNDANCY: Final = Topic("shardyard.redundancy", 1, "policy", RedundancyChanged, compacted=True)
ALERTS: Final = Topic("shardyard.alerts", 1, "alert rule/subject", AlertEvent)
"""The monitor's alerts firing and resolved: one partition, so every replica folds one history in one order."""
LINKS: Final = Topic("shardyard.links", 4, "node id|peer id", LinkMeasured, compacted=True)
"""Agents' link measurements (RTT, bandwidth), the latest per ordered node pair."""
QUEUES: Final = Topic("shardyard.queues", 1, "queues", QueuesConfigured, compacted=True)
"""The cluster's queue configuration (``shardyard.quotas``): the latest one, read from the queues file."""
DEADLETTER: Final = Topic("shardyard.deadletter", 1, "source key (raw bytes, error in headers)")

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
BY_NAME: Final = {topic.name: topic for topic in CATALOGUE}


def partition_of(key: str, topic: Topic) -> int:
    """The partition of ``topic`` that a record keyed ``key`` goes to: Kafka's default partitioner (murmur2 of the
    key, as aiokafka and the Java client compute it), which every Shardyard producer uses."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % topic.partitions
