"""Rebuild a service's state from the log: read topics from their beginning up to the end they had at start."""

import logging
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from shardyard.bus.codec import decode
from shardyard.bus.kafka import JOB_PATH_FETCH_MS
from shardyard.bus.topics import Topic
from shardyard.errors import EventDecodeError

log = logging.getLogger(__name__)


async def replay(bootstrap: str, topics: Iterable[Topic], apply: Callable[[Topic, Any], None]) -> int:
    """Feed every decodable event of ``topics`` (in partition order) to ``apply``; return how many were applied.

    Reads without a consumer group, so it never moves anyone's committed offsets.
    """
    by_name = {topic.name: topic for topic in topics}
    consumer = AIOKafkaConsumer(
        fetch_max_wait_ms=JOB_PATH_FETCH_MS,
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    applied = 0
    try:
        await consumer.topics()  # loads metadata for every topic
        partitions = [
            TopicPartition(name, p) for name in by_name for p in sorted(consumer.partitions_for_topic(name) or ())
        ]
        if not partitions:
            return 0
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends: dict[TopicPartition, int] = await consumer.end_offsets(partitions)
        pending = {tp for tp, end in ends.items() if end > 0}
        while pending:
            batches = await consumer.getmany(*pending, timeout_ms=500)
            for tp, records in batches.items():
                for record in records:
                    if record.offset >= ends[tp]:
                        break
                    try:
                        event = decode(by_name[tp.topic], record.value)
                    except EventDecodeError as exc:
                        log.warning("replay skips %s@%s: %s", tp, record.offset, exc)
                        continue
                    apply(by_name[tp.topic], event)
                    applied += 1
            for tp in list(pending):
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
    finally:
        await consumer.stop()
    return applied
