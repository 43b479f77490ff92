"""Rebuild a service's state from the log: read topics from their beginning up to the end they had at start; and
teach a consumer's replay memory the recent records it must believe once only (:func:`remember_recent`)."""

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka import TopicPartition

from shardyard.bus.assigned import assigned_consumer
from shardyard.bus.codec import decode
from shardyard.bus.quirks import fetch_wait_ms
from shardyard.bus.seal import FRESH_S, FROM_HEADER, Seal, believed_once, checker, refused, remember, screen_read
from shardyard.bus.topics import HEARTBEATS, LIFECYCLE, Topic
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


BELIEVED_ONCE_ON = frozenset({HEARTBEATS.name, LIFECYCLE.name})
"""The topics that carry what is believed once only (agents' beats and operators' drains; cancels)."""
CLOCK_SKEW_S = 5.0
"""Read back this much more than ``FRESH_S``: a sealer's clock ahead of the broker's."""


async def remember_recent(bootstrap: str, seal: Seal | None, topics: Iterable[Topic], *, window_s: float = 0.0) -> int:
    """Teach ``seal``'s replay memory the beats and commands appended to ``topics`` in the last ``FRESH_S`` (plus
    skew; ``window_s`` where given), before this process's group consumer resumes from its committed offsets: those
    it believed before a restart stay believed once (``bus.seal.remember``). Returns how many were remembered.

    Read without a group, positioned by time (``ListOffsets`` by timestamp). Only the topics of
    :data:`BELIEVED_ONCE_ON` are read; nothing without a seal."""
    by_name = {topic.name: topic for topic in topics if topic.name in BELIEVED_ONCE_ON}
    if seal is None or not by_name:
        return 0
    consumer, partitions = await assigned_consumer(bootstrap, by_name.values(), fetch_max_wait_ms=fetch_wait_ms())
    remembered = 0
    try:
        since_ms = int((time.time() - (window_s or FRESH_S + CLOCK_SKEW_S)) * 1000)
        starts = await consumer.offsets_for_times({tp: since_ms for tp in partitions})
        ends: dict[TopicPartition, int] = await consumer.end_offsets(partitions)
        pending = set()
        for tp, start in starts.items():
            if start is not None and start.offset < ends[tp]:  # None: nothing appended since
                consumer.seek(tp, start.offset)
                pending.add(tp)
        while pending:
            for tp, records in (await consumer.getmany(*pending, timeout_ms=500)).items():
                for record in records:
                    if record.offset >= ends[tp]:
                        break
                    remembered += _remembered(seal, by_name[tp.topic], record)
            for tp in list(pending):
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
    finally:
        await consumer.stop()
    return remembered


def _remembered(seal: Seal, topic: Topic, record: Any) -> int:
    """1 where ``record`` was remembered: only a beat's or a command's is decoded (the sealer's header says whose)."""
    sealer = next((value for name, value in record.headers or () if name == FROM_HEADER), b"")
    if not believed_once(sealer.decode(errors="replace")):
        return 0
    try:
        event = decode(topic, record.value)
    except EventDecodeError:
        return 0
    return int(remember(seal, topic.name, record, record.value or b"", event))
