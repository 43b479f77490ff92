"""Sealed events (``shardyard.bus.seal``): a seal verifies for what it sealed and nothing else, each component's key
is its own, who may publish what, the cluster secret's file, and the monitor's view of refused events and the
FORGED_EVENTS rule."""

import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiokafka import ConsumerRecord

from shardyard.bus.codec import encode, key_of, topic_of
from shardyard.bus.seal import (
    AGENT,
    FORGED_HEADER,
    Keys,
    Refusal,
    Seal,
    permitted,
    screen,
)
from shardyard.bus.topics import DEADLETTER, HEARTBEATS, NODE_STATE, Topic
from shardyard.cluster_secret import read_secret, write_secret
from shardyard.errors import ConfigError
from shardyard.events import (
    AlertRule,
    Event,
    JobCancelRequested,
    LeaderElected,
    NodeDrain,
    ServiceReady,
    ShardCompleted,
)
from shardyard.monitor.forged import forged_events
from shardyard.monitor.handlers import MonitorHandlers
from shardyard.monitor.metrics import MonitorMetrics
from shardyard.monitor.rules import AlertPolicy
from shardyard.monitor.views import ClusterView
from tests.unit.builders import at, heartbeat, node_state, relayed

KEYS = Keys(b"s" * 32)


def sealed_by(role: str, component: str, event: Event, keys: Keys = KEYS) -> list[tuple[str, bytes]]:
    seal = Seal(keys, role, component)
    return [(n, v.encode()) for n, v in seal.headers(topic_of(event).name, key_of(event), encode(event)).items()]


def check(event: Event, headers: list[tuple[str, bytes]] | None, body: bytes | None = None) -> Refusal | None:
    body = encode(event) if body is None else body
    return screen(Seal(KEYS, "", ""), topic_of(event).name, key_of(event), body, headers, event)


def completed(node_id: str = "node-a") -> ShardCompleted:
    return ShardCompleted(
        occurred_at=at(1), job_id="j", shard_index=0, attempt=1, node_id=node_id, final_loss=0.5, steps=9,
        checkpoint_dir=None,
    )  # fmt: skip


def test_a_seal_verifies_for_what_it_sealed() -> None:
    event = completed()
    assert check(event, sealed_by(AGENT, "node-a", event)) is None


@pytest.mark.parametrize(
    ("headers", "body", "refusal"),
    [
        (None, None, Refusal.UNSEALED),
        ([], None, Refusal.UNSEALED),
        ("another body", encode(completed()).replace(b"0.5", b"0.0"), Refusal.BAD_SEAL),
        ("another secret", None, Refusal.BAD_SEAL),
        ("another sealer", None, Refusal.BAD_SEAL),
        ("no role", None, Refusal.BAD_SEAL),
    ],
)
def test_a_seal_that_does_not_verify_is_refused(headers: object, body: bytes | None, refusal: Refusal) -> None:
    event = completed()
    good = sealed_by(AGENT, "node-a", event)
    if headers == "another body":
        headers = good
    elif headers == "another secret":
        headers = sealed_by(AGENT, "node-a", event, Keys(b"t" * 32))
    elif headers == "another sealer":
        headers = [(n, b"node-agent/node-b" if n == "x-shardyard-from" else v) for n, v in good]
    elif headers == "no role":
        headers = [(n, b"node-a" if n == "x-shardyard-from" else v) for n, v in good]
    assert check(event, headers, body) is refusal  # type: ignore[arg-type]


def test_each_component_has_a_key_of_its_own() -> None:
    assert len({KEYS.of("node-agent/node-a"), KEYS.of("node-agent/node-b"), KEYS.of("scheduler/node-a")}) == 3
    assert Keys(b"t" * 32).of("node-agent/node-a") != KEYS.of("node-agent/node-a")


@pytest.mark.parametrize(
    ("sealer", "event", "allowed"),
    [
        ("node-agent/node-a", completed("node-a"), True),
        ("node-agent/node-b", completed("node-a"), False),  # another node's shard
        ("node-agent/node-a", heartbeat("node-a"), True),
        ("node-agent/node-a", heartbeat("node-mallory"), False),
        ("node-relay/rack-1", relayed("rack-1", heartbeat("node-a"), heartbeat("node-b")), True),
        ("node-relay/rack-2", relayed("rack-1", heartbeat("node-a")), False),  # under another relay's name
        ("node-relay/rack-1", heartbeat("node-a"), False),  # a relay carries leases only
        ("node-agent/node-a", relayed("node-a", heartbeat("node-a")), False),
        ("node-agent/node-a", NodeDrain(occurred_at=at(1), node_id="node-a", draining=True), False),
        ("node-agent/node-a", JobCancelRequested(occurred_at=at(1), job_id="j"), False),
        ("admin/alice", JobCancelRequested(occurred_at=at(1), job_id="j"), True),
        ("admin/alice", NodeDrain(occurred_at=at(1), node_id="node-a", draining=True), True),
        ("admin/alice", completed(), False),
        ("scheduler/scheduler-0", LeaderElected(occurred_at=at(1), service="scheduler", instance="s", term=3), True),
        ("queue/queue-0", LeaderElected(occurred_at=at(1), service="scheduler", instance="q", term=9), False),
        ("scheduler/scheduler-0", completed(), True),  # a service relays and republishes what it learned
        ("mallory/x", completed(), False),
        (
            "node-agent/node-a",
            ServiceReady(occurred_at=at(1), service="node-agent", instance="node-a", pid=1, host="h"),
            True,
        ),
        (
            "node-agent/node-a",
            ServiceReady(occurred_at=at(1), service="node-agent", instance="node-b", pid=1, host="h"),
            False,
        ),
        (
            "node-agent/node-a",
            ServiceReady(occurred_at=at(1), service="scheduler", instance="node-a", pid=1, host="h"),
            False,
        ),
    ],
)
def test_who_may_publish_what(sealer: str, event: Event, allowed: bool) -> None:
    assert permitted(sealer, event) is allowed
    role, _, component = sealer.partition("/")
    refusal = check(event, sealed_by(role, component, event))
    assert refusal is (None if allowed else Refusal.NOT_PERMITTED)


def test_the_cluster_secret_file_is_refused_when_others_can_read_it(tmp_path: Path) -> None:
    path = write_secret(tmp_path / "cluster.secret")
    assert path.stat().st_mode & 0o777 == 0o600 and len(read_secret(path)) >= 32
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        read_secret(path)
    short = tmp_path / "short"
    short.write_text("abc")
    short.chmod(0o600)
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        read_secret(short)


@dataclass
class Bus:
    letters: list[tuple[str, str]] = field(default_factory=list)

    async def dead_letter_record(self, raw: bytes, record: ConsumerRecord[bytes, bytes], error: str) -> None:
        self.letters.append((record.topic, error))

    async def refuse(self, raw: bytes, record: ConsumerRecord[bytes, bytes], why: Refusal) -> None:
        self.letters.append((record.topic, why.value))


def record(
    topic: Topic,
    value: bytes,
    headers: list[tuple[str, bytes]] | None,
    key: bytes = b"node-a",
    stamp: int | None = None,
) -> object:
    stamp = int(at(1).timestamp() * 1000) if stamp is None else stamp
    return ConsumerRecord(topic.name, 0, 0, stamp, 0, key, value, None, len(value), len(value), headers or ())


async def test_the_monitor_folds_only_sealed_events_and_counts_the_refused_for_forged_events() -> None:
    view, bus = ClusterView(), Bus()
    monitor = MonitorHandlers(view, MonitorMetrics(view).events, bus, Seal(KEYS, "monitor", "monitor-0"))
    real, fake = heartbeat("node-a"), heartbeat("node-mallory")
    now_ms = int(time.time() * 1000)
    await monitor.on_records(
        HEARTBEATS,
        [
            # appended as they were sealed: now
            record(HEARTBEATS, encode(real), sealed_by(AGENT, "node-a", real), stamp=now_ms),  # type: ignore[list-item]
            record(HEARTBEATS, encode(fake), None, b"node-mallory", stamp=now_ms),  # type: ignore[list-item]
        ],
    )
    # The heartbeats' bad records are the pool's to dead-letter; a topic only followed is the monitor's.
    assert set(view.heartbeats) == {"node-a"} and bus.letters == []
    unsealed = node_state("node-mallory")
    await monitor.on_records(NODE_STATE, [record(NODE_STATE, encode(unsealed), None, b"node-mallory", stamp=now_ms)])  # type: ignore[list-item]
    assert bus.letters == [(NODE_STATE.name, "UNSEALED")] and "node-mallory" not in view.nodes

    # The consumers' dead letters: a forged one counts only when the dead letter's own seal verifies.
    letter = b"{}"
    seal = Seal(KEYS, "resource-pool", "resource-pool-0")
    headers = {"x-shardyard-source": "shardyard.assignments/0/7", FORGED_HEADER: "UNSEALED", "x-shardyard-error": "e"}
    genuine = [*((n, v.encode()) for n, v in headers.items())]
    genuine += [(n, v.encode()) for n, v in seal.headers(DEADLETTER.name, b"node-a", letter).items()]
    planted = [(n, v.encode()) for n, v in {**headers, "x-shardyard-source": "shardyard.links/0/1"}.items()]
    await monitor.on_records(DEADLETTER, [record(DEADLETTER, letter, genuine), record(DEADLETTER, letter, planted)])  # type: ignore[list-item]

    assert view.dead_lettered["shardyard.assignments"].forged == 1
    assert view.dead_lettered["shardyard.links"].forged == 0  # a dead letter anyone wrote raises no alarm
    firing = list(forged_events(view, at(60), AlertPolicy()))
    assert [(c.rule, c.subject) for c in firing] == [(AlertRule.FORGED_EVENTS, "shardyard.assignments")]
    assert not list(forged_events(view, at(1_000), AlertPolicy()))  # past the window
