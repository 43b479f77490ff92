"""FastStream's own parsers, for a record and a batch whose header values are not UTF-8
(``shardyard.bus.kafka._any_headers``): parsed, with the records handed on as they came."""

import re

import pytest
from aiokafka import ConsumerRecord
from faststream.kafka import KafkaMessage
from faststream.kafka.parser import AioKafkaBatchParser, AioKafkaParser

from shardyard.bus.kafka import _any_headers


def record(offset: int, headers: list[tuple[str, bytes]]) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic="t",
        partition=0,
        offset=offset,
        timestamp=0,
        timestamp_type=0,
        key=b"k",
        value=b"{}",
        checksum=None,
        serialized_key_size=1,
        serialized_value_size=2,
        headers=headers,
    )


BAD = [("x-shardyard-auth", b"\xb1\xf7 garbage"), ("x-ok", b"fine")]


async def test_a_record_with_a_header_that_is_not_utf8_is_parsed_and_kept_as_it_came() -> None:
    parser = AioKafkaParser(KafkaMessage, re.compile("t"))
    with pytest.raises(UnicodeDecodeError):
        await parser.parse_message(record(0, BAD))  # FastStream alone

    one = record(0, BAD)
    parsed = await _any_headers(one, parser.parse_message)
    assert parsed.raw_message is one and parsed.raw_message.headers == BAD
    assert parsed.headers["x-ok"] == "fine" and "\ufffd" in parsed.headers["x-shardyard-auth"]


async def test_a_batch_with_one_such_record_is_parsed_whole() -> None:
    parser = AioKafkaBatchParser(KafkaMessage, re.compile("t"))
    batch = (record(0, []), record(1, BAD), record(2, [("x-ok", b"fine")]))
    with pytest.raises(UnicodeDecodeError):
        await parser.parse_batch(batch)

    parsed = await _any_headers(batch, parser.parse_batch)
    assert parsed.raw_message is batch and [r.offset for r in parsed.raw_message] == [0, 1, 2]
    clean = (record(3, [("x-ok", b"fine")]),)
    assert (await _any_headers(clean, parser.parse_batch)).raw_message is clean
