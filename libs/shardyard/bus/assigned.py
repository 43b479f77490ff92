"""A consumer without a group, assigned every partition of its topics: how a replica reads a topic whole.

No group means no rebalances and nothing committed: reading never moves anyone's offsets, and every reader sees every
partition. Followers (:mod:`shardyard.bus.follow`), replays (:mod:`shardyard.bus.replay`) and the monitor's feed
read this way; each decides what it does with the records.
"""

import asyncio
import time
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from shardyard.bus.topics import Topic
from shardyard.bus.transport import client_options


async def assigned_consumer(
    bootstrap: str,
    topics: Iterable[Topic],
    *,
    fetch_max_wait_ms: int,
    client_id: str | None = None,
    from_end: Iterable[Topic] = (),
) -> tuple[AIOKafkaConsumer, list[TopicPartition]]:
    """A started consumer without a group, assigned every partition of ``topics`` and positioned at their beginning
    (the partitions of ``from_end`` at their end), with those partitions. If positioning fails it is stopped."""
    named = {"client_id": client_id} if client_id is not None else {}
    consumer = AIOKafkaConsumer(
        fetch_max_wait_ms=fetch_max_wait_ms,
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **named,
        **client_options(),
    )
    await consumer.start()
    try:
        partitions = await assign_every_partition(consumer, topics, from_end=from_end)
    except BaseException:
        await consumer.stop()
        raise
    return consumer, partitions


async def assign_every_partition(
    consumer: AIOKafkaConsumer, topics: Iterable[Topic], *, from_end: Iterable[Topic] = ()
) -> list[TopicPartition]:
    """Assign ``consumer`` every partition of ``topics`` (in topic order, then partition order) and position each at
    its beginning, or at its end for the topics of ``from_end``; return the partitions. Ends are resolved now, not at
    the first fetch: what is published once this returns will be read."""
    names = list(dict.fromkeys(topic.name for topic in topics))
    ends = {topic.name for topic in from_end}
    partitions = await partitions_of(consumer, names)
    consumer.assign(partitions)
    beginning = [tp for tp in partitions if tp.topic not in ends]
    end = [tp for tp in partitions if tp.topic in ends]
    if beginning:
        await consumer.seek_to_beginning(*beginning)
    if end:
        await consumer.seek_to_end(*end)
    for tp in end:
        await consumer.position(tp)
    return partitions


METADATA_WAIT_S = 30.0
"""How long :func:`partitions_of` waits for a broker that answers metadata naming no broker."""


async def partitions_of(
    consumer: AIOKafkaConsumer, names: Iterable[str], *, wait_s: float = METADATA_WAIT_S
) -> list[TopicPartition]:
    """Every partition of the topics ``names``, as the broker has them now (in name, then partition order).

    ``consumer.topics()`` reads the metadata of every topic into a copy of its own and leaves the consumer's (what
    ``partitions_for_topic`` reads) to the topics the consumer tracks: none before it is assigned any. A refresh of
    that metadata then names no topic, which Tansu answers with every topic and Apache Kafka with none: only the
    copy has them on both.

    Apache Kafka only: a KRaft broker that was paused longer than its session timeout (a hung host, SIGSTOP) is
    fenced by its controller and, until it registers again, answers metadata naming no broker, which aiokafka
    raises as a :class:`KafkaError`. That is retried for up to ``wait_s``; Tansu never answers so."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            cluster = await consumer._client.fetch_all_metadata()
        except KafkaError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.25)
            continue
        return [TopicPartition(name, p) for name in names for p in sorted(cluster.partitions_for_topic(name) or ())]
