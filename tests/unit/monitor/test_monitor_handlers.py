"""The monitor folds the feed's batches: each record of a topic in order, the undecodable ones dead-lettered with the
reason, dead letters counted; consumed events are counted per topic, once folded."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiokafka import ConsumerRecord
from prometheus_client import REGISTRY

from shardyard.bus.codec import encode
from shardyard.bus.topics import DEADLETTER, HEARTBEATS, NODE_STATE, Topic
from shardyard.monitor.handlers import MonitorHandlers
from shardyard.monitor.metrics import MonitorMetrics
from shardyard.monitor.views import ClusterView
from tests.unit.builders import at, heartbeat, node_state


@dataclass
class DeadLetters:
    """The one thing the handlers ask of the bus: dead-lettering a record."""

    sent: list[tuple[bytes, str, str]] = field(default_factory=list)

    async def dead_letter_record(self, raw: bytes, record: ConsumerRecord[bytes, bytes], error: str) -> None:
        self.sent.append((raw, f"{record.topic}/{record.partition}/{record.offset}", error))


def records(topic: Topic, *values: bytes) -> list[ConsumerRecord[bytes, bytes]]:
    return [
        ConsumerRecord(topic.name, 0, offset, 0, 0, b"k", value, None, len(value), len(value), ())
        for offset, value in enumerate(values)
    ]


def handlers() -> tuple[MonitorHandlers, ClusterView, MonitorMetrics, DeadLetters]:
    view = ClusterView()
    exported, dead = MonitorMetrics(view), DeadLetters()
    return MonitorHandlers(view, exported.events, dead), view, exported, dead


def folded(exported: MonitorMetrics, topic: Topic) -> float:
    return exported.registry.get_sample_value("shardyard_monitor_events_total", {"topic": topic.name}) or 0.0


def consumed(topic: Topic) -> float:
    """This process's count of messages read (``shardyard.metrics``, on the default registry)."""
    return REGISTRY.get_sample_value("shardyard_events_consumed_total", {"topic": topic.name}) or 0.0


async def test_a_batch_folds_in_order() -> None:
    handle, view, exported, dead = handlers()
    older, newer = node_state("n1", last_heartbeat_at=at(1)), node_state("n1", last_heartbeat_at=at(2))

    await handle.on_records(NODE_STATE, records(NODE_STATE, encode(older), encode(newer)))

    assert view.nodes["n1"].last_heartbeat_at == at(2)
    assert folded(exported, NODE_STATE) == 2 and dead.sent == []


async def test_an_undecodable_record_is_dead_lettered_and_the_rest_folded() -> None:
    handle, view, exported, dead = handlers()
    before = consumed(NODE_STATE)

    await handle.on_records(NODE_STATE, records(NODE_STATE, b"not a node state", encode(node_state("n1"))))

    assert [(raw, source) for raw, source, _error in dead.sent] == [(b"not a node state", f"{NODE_STATE.name}/0/0")]
    assert "not a shardyard.nodes.state event" in dead.sent[0][2]
    assert "n1" in view.nodes
    assert folded(exported, NODE_STATE) == 1  # the refused record is not a consumed event...
    assert consumed(NODE_STATE) == before + 2  # ...but was read


async def test_a_bad_record_of_a_topic_a_service_group_reads_is_that_services_to_dead_letter() -> None:
    handle, view, exported, dead = handlers()

    await handle.on_records(HEARTBEATS, records(HEARTBEATS, b"not a heartbeat", encode(heartbeat("n1"))))

    assert dead.sent == []  # the resource pool's group dead-letters it: one dead letter, not one per reader
    assert "n1" in view.heartbeats and folded(exported, HEARTBEATS) == 1


async def test_replicas_share_the_dead_letters_by_partition_and_leave_those_from_before_their_start() -> None:
    view = ClusterView()
    bad = [
        ConsumerRecord(NODE_STATE.name, partition, 0, stamp, 0, b"k", b"x", None, 1, 1, ())
        for partition, stamp in ((0, 500), (1, 500), (2, 500), (3, 100))
    ]
    sent: dict[int, list[str]] = {}
    for this in (0, 1):
        dead = DeadLetters()
        handle = MonitorHandlers(view, MonitorMetrics(view).events, dead, share=(this, 2), since_ms=200)
        await handle.on_records(NODE_STATE, bad)
        sent[this] = [source for _raw, source, _error in dead.sent]

    assert sent == {0: [f"{NODE_STATE.name}/0/0", f"{NODE_STATE.name}/2/0"], 1: [f"{NODE_STATE.name}/1/0"]}


async def test_dead_letters_are_counted() -> None:
    handle, view, _exported, dead = handlers()

    await handle.on_records(DEADLETTER, records(DEADLETTER, b"x", b"y"))

    assert view.dead_letters == 2 and dead.sent == []
