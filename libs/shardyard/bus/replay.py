"""Rebuild a service's state from the log: read topics from their beginning up to the end they had at start."""

import logging
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka import TopicPartition

from shardyard.bus.assigned import assigned_consumer
from shardyard.bus.codec import decode
from shardyard.bus.quirks import fetch_wait_ms
from shardyard.bus.seal import checker, refused, screen_read
from shardyard.bus.topics import Topic
from shardyard.errors import EventDecodeError

log = logging.getLogger(__name__)


async def replay(bootstrap: str, topics: Iterable[Topic], apply: Callable[[Topic, Any], None]) -> int:
    """Feed every decodable event of ``topics`` (in partition order) to ``apply``; return how many were applied.

    Reads without a consumer group, so it never moves anyone's committed offsets.
    """
    by_name = {topic.name: topic for topic in topics}
    consumer, partitions = await assigned_consumer(
        bootstrap, by_name.values(), fetch_max_wait_ms=fetch_wait_ms(job_path=True)
    )
    applied, seal = 0, checker()
    try:
        if not partitions:
            return 0
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
                    why = screen_read(seal, tp.topic, record, record.value or b"", event)
                    if why is not None:
                        log.warning("replay skips %s@%s: %s", tp, record.offset, refused(why, tp.topic, record.headers))
                        continue
                    apply(by_name[tp.topic], event)
                    applied += 1
            for tp in list(pending):
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
    finally:
        await consumer.stop()
    return applied
