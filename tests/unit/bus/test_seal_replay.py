"""Sealed events are good once, within a bounded time (``shardyard.bus.seal``): a record appended long after its
sealing is refused as REPLAYED; within that time an agent's beat is believed once by number and an operator's command
once by event id, while the same record read again at its own offset still is."""

import pytest

from shardyard.bus.codec import encode, key_of, topic_of
from shardyard.bus.seal import ADMIN, AGENT, FRESH_S, Keys, Refusal, Seal, screen
from shardyard.events import Event, NodeDrain, lease_of
from tests.unit.builders import at, heartbeat

KEYS = Keys(b"s" * 32)
SEALED_MS = 1_800_000_000_000


def headers(role: str, component: str, event: Event, sealed_ms: int = SEALED_MS) -> list[tuple[str, bytes]]:
    seal = Seal(KEYS, role, component)
    sealed = seal.headers(topic_of(event).name, key_of(event), encode(event), sealed_at_ms=sealed_ms)
    return [(name, value.encode()) for name, value in sealed.items()]


class Consumer:
    """One process's checks, over records of one partition."""

    def __init__(self) -> None:
        self.seal = Seal(KEYS, "resource-pool", "resource-pool-0")

    def read(self, event: Event, sealed: list[tuple[str, bytes]], *, offset: int, appended_ms: int) -> Refusal | None:
        topic = topic_of(event).name
        return screen(
            self.seal, topic, key_of(event), encode(event), sealed, event, appended_ms=appended_ms, where=(0, offset)
        )


@pytest.mark.parametrize(
    ("late_s", "refused"),
    [
        pytest.param(0.2, None, id="appended-at-once"),
        pytest.param(FRESH_S - 1, None, id="a-slow-producer-within-the-bound"),
        pytest.param(FRESH_S + 1, Refusal.REPLAYED, id="played-back-later"),
        pytest.param(-(FRESH_S + 1), Refusal.REPLAYED, id="stamped-before-its-sealing"),
    ],
)
def test_a_record_appended_long_after_its_sealing_is_refused(late_s: float, refused: Refusal | None) -> None:
    beat = heartbeat("node-a", seq=3)
    sealed = headers(AGENT, "node-a", beat)
    assert Consumer().read(beat, sealed, offset=5, appended_ms=SEALED_MS + int(late_s * 1000)) is refused


def test_a_replayed_lease_is_refused_while_a_newer_one_was_read_before_it() -> None:
    consumer = Consumer()
    old, new = lease_of(heartbeat("node-a", seq=7)), lease_of(heartbeat("node-a", seq=8))
    captured = headers(AGENT, "node-a", old)
    assert consumer.read(old, captured, offset=10, appended_ms=SEALED_MS) is None
    assert consumer.read(new, headers(AGENT, "node-a", new), offset=11, appended_ms=SEALED_MS + 1000) is None
    # The captured lease, byte for byte, appended again within the freshness bound: after beat 8, so played back.
    assert consumer.read(old, captured, offset=12, appended_ms=SEALED_MS + 2000) is Refusal.REPLAYED
    # Beat 8 itself again, appended again: a beat is believed once.
    assert (
        consumer.read(new, headers(AGENT, "node-a", new), offset=13, appended_ms=SEALED_MS + 2000) is Refusal.REPLAYED
    )
    # The log read again from before them (a rebalance): each at its own offset, still genuine.
    assert consumer.read(old, captured, offset=10, appended_ms=SEALED_MS) is None
    assert consumer.read(new, headers(AGENT, "node-a", new), offset=11, appended_ms=SEALED_MS + 1000) is None


def test_a_restarted_agent_numbers_its_beats_again() -> None:
    consumer = Consumer()
    before = heartbeat("node-a", seq=40, agent_instance="node-a-1")
    after = heartbeat("node-a", seq=1, agent_instance="node-a-2")
    assert consumer.read(before, headers(AGENT, "node-a", before), offset=1, appended_ms=SEALED_MS) is None
    assert consumer.read(after, headers(AGENT, "node-a", after), offset=2, appended_ms=SEALED_MS) is None


def test_an_operators_command_is_believed_once() -> None:
    consumer = Consumer()
    undrain = NodeDrain(occurred_at=at(0), node_id="node-b", draining=False)
    captured = headers(ADMIN, "operator", undrain)
    assert consumer.read(undrain, captured, offset=20, appended_ms=SEALED_MS) is None
    assert consumer.read(undrain, captured, offset=20, appended_ms=SEALED_MS) is None  # read again: the same record
    assert consumer.read(undrain, captured, offset=31, appended_ms=SEALED_MS + 5000) is Refusal.REPLAYED
    again = NodeDrain(occurred_at=at(1), node_id="node-b", draining=False)  # a new command saying the same: believed
    assert consumer.read(again, headers(ADMIN, "operator", again), offset=32, appended_ms=SEALED_MS) is None


def test_the_sealing_time_is_sealed() -> None:
    beat = heartbeat("node-a", seq=3)
    sealed = [
        (name, str(SEALED_MS + 3_600_000).encode() if name == "x-shardyard-sealed-at" else value)
        for name, value in headers(AGENT, "node-a", beat)
    ]  # a replay given a fresh time
    assert Consumer().read(beat, sealed, offset=1, appended_ms=SEALED_MS + 3_600_000) is Refusal.BAD_SEAL
