"""A follower passes over the event types it was told its service never applies, by the type header ``Bus.send``
sets, without decoding them; a record without the header is decoded and handed over as ever."""

from aiokafka import TopicPartition

from shardyard.bus.codec import TYPE_HEADER, encode
from shardyard.bus.follow import Follower
from shardyard.bus.topics import LIFECYCLE
from shardyard.events import JobAccepted, JobReady
from tests.unit.builders import at, job_spec

PARTITION = TopicPartition(LIFECYCLE.name, 0)
SPEC = job_spec(job_id="j")


async def handed_over(*records: tuple[bytes, list[tuple[str, bytes]] | None]) -> list[str]:
    seen: list[str] = []

    async def handle(_topic: object, event: object) -> None:
        seen.append(type(event).__name__)

    follower = Follower("unused:9092", [LIFECYCLE], handle, name="test-follower", unread=frozenset({"job.accepted"}))
    for offset, (raw, headers) in enumerate(records):
        await follower._hand_over(LIFECYCLE, PARTITION, offset, raw, headers, b"j")
    return seen


async def test_a_follower_passes_over_the_types_it_never_applies() -> None:
    accepted = encode(JobAccepted(occurred_at=at(1), job_id="j", spec=SPEC, source_offset="s/0/1"))
    ready = encode(JobReady(occurred_at=at(2), job_id="j", spec=SPEC))

    seen = await handed_over(
        (accepted, [(TYPE_HEADER, b"job.accepted")]),
        (ready, [(TYPE_HEADER, b"job.ready")]),
        (accepted, None),  # an older producer's record: no header, read as ever
    )

    assert seen == ["JobReady", "JobAccepted"]
