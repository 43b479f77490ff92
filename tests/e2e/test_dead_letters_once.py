"""One dead letter per bad record, against a real cluster (``shardyard up``: two replicas of each service, three
agents, sealed events). Garbage and unsealed events written to the topics every kind of reader consumes (the pool's
group, the fault manager's group, the agents' groups of their own, every monitor replica) each get exactly one dead
letter (``topics.dead_letterer``), not one per reader."""

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from shardyard.bus.codec import encode, key_of
from shardyard.bus.topics import ASSIGNMENTS, DEADLETTER, HEARTBEATS, LIFECYCLE, SHARD_EVENTS, Topic
from shardyard.bus.transport import client_options
from shardyard.cli.cluster import ClusterInfo
from shardyard.cli.cluster_info import ADMIN_PRINCIPAL
from tests.support import wait
from tests.support.cluster import cli, speaking_as
from tests.support.events import Producer
from tests.unit.builders import heartbeat

pytestmark = [pytest.mark.slow, pytest.mark.broker]

EACH = 40
"""Bad records written to each topic."""
GARBAGE = (b"{not json", b'{"type": "nope"}', b"\x00\xff", b"[]")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterInfo]:
    run_dir = tmp_path_factory.mktemp("letters")
    started = cli("up", "--node", "A100:1", "--node", "A100:1", "--node", "A100:1", run_dir=run_dir, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        info = ClusterInfo.load(run_dir)
        with speaking_as(info, ADMIN_PRINCIPAL):  # writes where an operator may, as an attacker with its keys could
            yield info
    finally:
        cli("down", run_dir=Path(run_dir), timeout=120)


async def flood(bootstrap: str, topics: list[Topic]) -> set[str]:
    """Write ``EACH`` bad records to each topic; where each landed (``topic/partition/offset``)."""
    landed: set[str] = set()
    unsealed = heartbeat("node-0", seq=10**9)  # well-formed, with no seal
    async with Producer(bootstrap) as send:
        for topic in topics:
            for index in range(EACH):
                body = encode(unsealed) if index % 5 == 4 else GARBAGE[index % len(GARBAGE)]
                key = key_of(unsealed) if index % 5 == 4 else f"bad-{index}".encode()
                meta = await send.raw(topic.name, body, key=key)
                landed.add(f"{meta.topic}/{meta.partition}/{meta.offset}")
    return landed


def dead_letters(bootstrap: str) -> Counter[str]:
    """Dead letters by the record they stand for (``x-shardyard-source``)."""

    async def read() -> Counter[str]:
        consumer = AIOKafkaConsumer(
            DEADLETTER.name, bootstrap_servers=bootstrap, auto_offset_reset="earliest", **client_options()
        )
        await consumer.start()
        found: Counter[str] = Counter()
        try:
            while batches := await consumer.getmany(timeout_ms=1500, max_records=100_000):
                for records in batches.values():
                    for record in records:
                        headers = dict(record.headers or ())
                        found[headers["x-shardyard-source"].decode()] += 1
        finally:
            await consumer.stop()
        return found

    return asyncio.run(read())


@pytest.mark.timeout(300)
def test_each_bad_record_gets_one_dead_letter_however_many_read_it(cluster: ClusterInfo) -> None:
    landed = asyncio.run(flood(cluster.bootstrap, [HEARTBEATS, SHARD_EVENTS, ASSIGNMENTS, LIFECYCLE]))

    def all_lettered() -> Counter[str] | None:
        found = dead_letters(cluster.bootstrap)
        return found if landed <= set(found) else None

    letters = wait.until(
        all_lettered,
        "a dead letter for every bad record",
        120,
        every_s=1.0,
        describe=lambda: sorted(landed - set(dead_letters(cluster.bootstrap)))[:10],
    )
    twice = {source: count for source, count in letters.items() if source in landed and count != 1}
    assert not twice, f"{len(twice)} of {len(landed)} dead-lettered more than once: {list(twice.items())[:5]}"
