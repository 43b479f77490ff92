"""Encoding events to bytes and decoding a topic's bytes back into its events."""

from functools import cache
from typing import Any, Final

from pydantic import TypeAdapter, ValidationError

from shardyard.bus.topics import (
    ASSIGNMENTS,
    CATALOGUE,
    ELASTICITY,
    FAILURES,
    HEARTBEATS,
    LEADERSHIP,
    LINKS,
    NODE_STATE,
    QUEUES,
    REDUNDANCY,
    SERVICES,
    Topic,
)
from shardyard.errors import EventDecodeError
from shardyard.events import QUEUES_KEY, AlertFiring, AlertResolved, Event, LinkMeasured, link_key
from shardyard.events.alert import alert_key

_TOPIC_OF: dict[type[Event], Topic] = {event: topic for topic in CATALOGUE for event in topic.events}
"""Each event type's topic, from the catalogue: the topic whose payload names it."""


def topic_of(event: Event) -> Topic:
    return _TOPIC_OF[type(event)]


def topic_of_type(event_type: type[Event]) -> Topic:
    """The topic events of ``event_type`` go on."""
    return _TOPIC_OF[event_type]


TYPE_HEADER: Final = "x-shardyard-type"
"""Header naming the event type a record carries (``Bus.send`` sets it), so that a follower passes over the types it
never applies without decoding them. Not covered by the seal: a record whose header lies is at worst passed over by
a follower that would have ignored what the header names, or decoded and checked as ever."""


def key_of(event: Event) -> bytes:
    """The partition key: node id on node-keyed topics, job id on job-keyed ones."""
    topic = topic_of(event)
    if topic in (HEARTBEATS, NODE_STATE, FAILURES, ASSIGNMENTS):
        return str(getattr(event, "node_id")).encode()  # noqa: B009 - every event of these topics has one
    if topic in (SERVICES, LEADERSHIP):
        return str(getattr(event, "service")).encode()  # noqa: B009
    if topic is LINKS and isinstance(event, LinkMeasured):
        return link_key(event.node_id, event.peer_id).encode()
    if topic is REDUNDANCY:
        return b"policy"
    if topic is QUEUES:
        return QUEUES_KEY.encode()
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
