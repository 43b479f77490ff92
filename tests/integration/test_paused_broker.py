"""A reader asks for its partitions while the broker cannot name itself, and gets them once it can.

Apache Kafka fences a KRaft broker paused past ``broker.session.timeout.ms`` (a hung host: SIGSTOP); resumed, it
answers metadata naming no broker until it registers again, which aiokafka raises as a ``KafkaError`` (one such
failure was seen on CI, just after a pause). That answer cannot be had on demand, so the test takes the same error
from a broker that is down for a moment and comes back on its port: :func:`shardyard.bus.assigned.partitions_of`
waits either out."""

import asyncio
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from shardyard.bus.admin import ensure_topics
from shardyard.bus.assigned import partitions_of
from shardyard.bus.topics import SHARD_EVENTS
from shardyard.bus.transport import client_options
from tests.support.broker import own_broker

pytestmark = pytest.mark.broker


async def test_a_reader_asking_while_the_broker_is_away_gets_every_partition_once_it_is_back(tmp_path: Path) -> None:
    broker = own_broker("kafka", tmp_path / "broker").start()
    try:
        await ensure_topics(broker.bootstrap)
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, **client_options())
        await consumer.start()
        try:
            broker.stop()
            asking = asyncio.create_task(partitions_of(consumer, [SHARD_EVENTS.name]))
            await asyncio.sleep(0.5)  # not a wait for an outcome: the question is asked while the broker is away
            assert not asking.done(), "an answer (or a failure) while the broker was away"
            broker.start()  # the same port and log
            partitions = await asyncio.wait_for(asking, timeout=60)
        finally:
            await consumer.stop()
        assert {tp.topic for tp in partitions} == {SHARD_EVENTS.name}
        assert len(partitions) == SHARD_EVENTS.partitions
    finally:
        broker.stop()
