"""A consumer that resumes from committed offsets first reads back the last minute of its topic into its replay
memory (``shardyard.bus.replay.remember_recent``), on each broker: an operator's command and an agent's beat it
believed before a restart, appended again by an eavesdropper, are still refused as REPLAYED."""

import time

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.codec import encode, key_of, topic_of
from shardyard.bus.replay import remember_recent
from shardyard.bus.seal import ADMIN, AGENT, Keys, Refusal, Seal, screen
from shardyard.bus.topics import HEARTBEATS
from shardyard.events import Event, NodeDrain
from tests.support.events import Producer
from tests.unit.builders import at, heartbeat

pytestmark = pytest.mark.broker

KEYS = Keys(b"r" * 32)


def sealed(role: str, component: str, event: Event) -> list[tuple[str, bytes]]:
    headers = Seal(KEYS, role, component).headers(topic_of(event).name, key_of(event), encode(event))
    return [(name, value.encode()) for name, value in headers.items()]


async def append(bootstrap: str, event: Event, headers: list[tuple[str, bytes]]) -> tuple[int, int, int]:
    """``event``'s record appended with ``headers``: its partition, offset and broker timestamp."""
    async with Producer(bootstrap) as send:
        meta = await send.raw(HEARTBEATS.name, encode(event), key=key_of(event), headers=headers)
    return meta.partition, meta.offset, meta.timestamp if meta.timestamp > 0 else int(time.time() * 1000)


async def test_a_restarted_consumer_still_refuses_what_it_believed_before(bootstrap: str) -> None:
    await ensure_topics(bootstrap)
    drain = NodeDrain(occurred_at=at(0), node_id="node-r", draining=False)
    beat = heartbeat("node-r", seq=5, agent_instance="node-r-1")
    drain_headers, beat_headers = sealed(ADMIN, "operator", drain), sealed(AGENT, "node-r", beat)
    await append(bootstrap, drain, drain_headers)
    await append(bootstrap, beat, beat_headers)

    restarted = Seal(KEYS, "resource-pool", "resource-pool-0")  # a new process: its memory is empty
    assert await remember_recent(bootstrap, restarted, [HEARTBEATS]) == 2

    for event, headers in ((drain, drain_headers), (beat, beat_headers)):
        partition, offset, appended_ms = await append(bootstrap, event, headers)  # played back
        why = screen(
            restarted,
            HEARTBEATS.name,
            key_of(event),
            encode(event),
            headers,
            event,
            appended_ms=appended_ms,
            where=(partition, offset),
        )
        assert why is Refusal.REPLAYED, f"{event.type} played back after a restart: {why}"


async def test_without_a_seal_nothing_is_read(bootstrap: str) -> None:
    assert await remember_recent(bootstrap, None, [HEARTBEATS]) == 0
