"""The catalogue is the one place that says which topic an event goes on: the lifecycle topic carries exactly the
lifecycle union, every event type has one topic, and the codec routes by the catalogue."""

from __future__ import annotations

from typing import get_args

import pytest

from shardyard.bus.codec import _TOPIC_OF
from shardyard.bus.topics import CATALOGUE, DEADLETTER, LIFECYCLE, NODE_STATE, SUBMISSIONS, Topic
from shardyard.events import Event, NodeState
from shardyard.lifecycle import LifecycleFact


def _event_classes(cls: type[Event] = Event) -> set[type[Event]]:
    out: set[type[Event]] = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_event_classes(sub)}
    return out


def test_the_lifecycle_topic_carries_exactly_the_lifecycle_union() -> None:
    assert set(LIFECYCLE.events) == set(get_args(LifecycleFact))
    assert len(LIFECYCLE.events) == len(get_args(LifecycleFact))


@pytest.mark.parametrize("event", get_args(LifecycleFact), ids=lambda event: event.__name__)
def test_every_lifecycle_event_goes_on_the_lifecycle_topic(event: type[Event]) -> None:
    assert _TOPIC_OF[event] is LIFECYCLE


def test_every_lifecycle_event_on_the_lifecycle_topic_is_in_the_union() -> None:
    assert {event for event, topic in _TOPIC_OF.items() if topic is LIFECYCLE} == set(get_args(LifecycleFact))


def test_every_event_type_has_one_topic() -> None:
    carried = [event for topic in CATALOGUE for event in topic.events]

    assert len(carried) == len(set(carried)), "an event type on two topics"
    assert set(carried) == _event_classes()


def test_the_codec_routes_by_the_catalogue() -> None:
    assert {event: topic for topic in CATALOGUE for event in topic.events} == _TOPIC_OF


@pytest.mark.parametrize(
    ("topic", "events"),
    [
        pytest.param(SUBMISSIONS, (), id="raw-submissions"),
        pytest.param(DEADLETTER, (), id="raw-dead-letters"),
        pytest.param(NODE_STATE, (NodeState,), id="one-event-type"),
        pytest.param(Topic("t", 1, "k", NodeState | Event), (NodeState, Event), id="plain-union"),
    ],
)
def test_the_events_of_a_topic_are_read_off_its_payload(topic: Topic, events: tuple[type[Event], ...]) -> None:
    assert topic.events == events


def test_a_topic_rebuilt_from_its_beginning_is_kept_whole() -> None:
    from shardyard.bus.topics import ASSIGNMENTS, LEADERSHIP, SHARD_EVENTS

    for topic in (LIFECYCLE, ASSIGNMENTS, SHARD_EVENTS, LEADERSHIP):
        assert topic.configs["retention.ms"] == "-1", topic.name
        assert topic.configs["retention.bytes"] == "-1", topic.name


def test_a_bounded_topic_closes_its_segments_within_its_window() -> None:
    from shardyard.bus.topics import HEARTBEATS

    configs = HEARTBEATS.configs
    assert int(configs["segment.ms"]) < int(configs["retention.ms"]) <= 3_600_000


def test_every_topic_says_how_long_it_is_kept() -> None:
    for topic in CATALOGUE:
        assert topic.configs["cleanup.policy"] in ("compact", "delete"), topic.name
        if topic.compacted:
            assert topic.configs["cleanup.policy"] == "compact"
            assert int(topic.configs["segment.ms"]) <= 3_600_000, "a compacted topic's segment must close"
