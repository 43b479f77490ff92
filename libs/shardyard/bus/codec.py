"""Encoding events to bytes and decoding a topic's bytes back into its events."""

from functools import cache
from typing import Any

from pydantic import TypeAdapter, ValidationError

from shardyard.bus.topics import (
    ALERTS,
    ASSIGNMENTS,
    ELASTICITY,
    FAILURES,
    HEARTBEATS,
    LEADERSHIP,
    LIFECYCLE,
    NODE_STATE,
    REDUNDANCY,
    SERVICES,
    SHARD_EVENTS,
    Topic,
)
from shardyard.errors import EventDecodeError
from shardyard.events import (
    AlertFiring,
    AlertResolved,
    CapacityRequested,
    Event,
    Heartbeat,
    JobAccepted,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPreempted,
    JobPreempting,
    JobReady,
    JobRecovering,
    JobRejected,
    JobRunning,
    JobScheduled,
    JobSucceeded,
    JobUnschedulable,
    JobWaiting,
    LeaderElected,
    LeadershipClaimed,
    NodeDrain,
    NodeLease,
    NodeLost,
    NodeState,
    ReclaimCandidate,
    RedundancyChanged,
    ServiceReady,
    ShardAssignment,
    ShardCheckpointed,
    ShardCompleted,
    ShardFailed,
    ShardPreempted,
    ShardProgress,
    ShardRevocation,
    ShardStarted,
    ShardStopRequest,
)
from shardyard.events.alert import alert_key

_TOPIC_OF: dict[type[Event], Topic] = {
    **dict.fromkeys(
        (
            JobAccepted,
            JobRejected,
            JobReady,
            JobWaiting,
            JobUnschedulable,
            JobScheduled,
            JobRunning,
            JobSucceeded,
            JobFailed,
            JobRecovering,
            JobPreempting,
            JobPreempted,
            JobCancelRequested,
            JobCancelled,
        ),
        LIFECYCLE,
    ),
    Heartbeat: HEARTBEATS,
    NodeLease: HEARTBEATS,
    NodeDrain: HEARTBEATS,
    NodeState: NODE_STATE,
    NodeLost: FAILURES,
    ShardAssignment: ASSIGNMENTS,
    ShardRevocation: ASSIGNMENTS,
    ShardStopRequest: ASSIGNMENTS,
    **dict.fromkeys(
        (ShardStarted, ShardProgress, ShardCheckpointed, ShardCompleted, ShardFailed, ShardPreempted), SHARD_EVENTS
    ),
    ServiceReady: SERVICES,
    LeaderElected: SERVICES,
    LeadershipClaimed: LEADERSHIP,
    CapacityRequested: ELASTICITY,
    ReclaimCandidate: ELASTICITY,
    RedundancyChanged: REDUNDANCY,
    AlertFiring: ALERTS,
    AlertResolved: ALERTS,
}


def topic_of(event: Event) -> Topic:
    return _TOPIC_OF[type(event)]


def key_of(event: Event) -> bytes:
    """The partition key: node id on node-keyed topics, job id on job-keyed ones."""
    topic = topic_of(event)
    if topic in (HEARTBEATS, NODE_STATE, FAILURES, ASSIGNMENTS):
        return str(getattr(event, "node_id")).encode()  # noqa: B009 - every event of these topics has one
    if topic in (SERVICES, LEADERSHIP):
        return str(getattr(event, "service")).encode()  # noqa: B009
    if topic is REDUNDANCY:
        return b"policy"
    if isinstance(event, AlertFiring | AlertResolved):
        return alert_key(event.rule, event.subject).encode()
    if topic is ELASTICITY:
        return str(getattr(event, "node_id", None) or getattr(event, "gpu_model")).encode()  # noqa: B009
    return str(getattr(event, "job_id")).encode()  # noqa: B009


def encode(event: Event) -> bytes:
    return event.model_dump_json().encode()


@cache
def _adapter(payload: Any) -> TypeAdapter[Any]:
    return TypeAdapter(payload)


def decode(topic: Topic, raw: bytes) -> Any:
    """Decode ``raw`` as an event of ``topic``; EventDecodeError says why it is not one."""
    if topic.payload is None:
        raise EventDecodeError(f"{topic.name} carries raw bytes, not events")
    try:
        return _adapter(topic.payload).validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(root)"
        raise EventDecodeError(f"not a {topic.name} event: {where}: {first['msg']}") from exc
