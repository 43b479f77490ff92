"""10,000 mutated submissions at a queue that takes only signed ones: valid documents signed and then changed by
one byte, signed with a wrong, revoked or unknown key, with a credential cut short or garbled, replayed, unsigned,
over-long, nested deep, or not JSON at all. Each gets exactly one answer, a rejection with a typed reason; the
process's peak memory grows by under 64 MiB over the last 9,000; and a valid job signed after them all is
accepted."""

import random
import resource

import pytest

from shardyard.events import JobAccepted, JobRejected, RejectReason
from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.queue.book import QueueBook
from shardyard.signing import AUTH_HEADER, SIGNATURE_HEADER, Credentials, sign
from tests.unit.builders import at, raw, submission

KEY = "ab" * 32
CREDENTIALS = Credentials.model_validate(
    {"teams": {"team-a": {"keys": {"k1": {"secret": "aa" * 32, "revoked": True}, "k2": {"secret": KEY}}}}}
)
NOW = at(5000)
SUBMISSIONS = 10_000


def signed(body: bytes, **fields: object) -> list[tuple[str, bytes]]:
    values = {"team": "team-a", "key_id": "k2", "secret": KEY, "now_s": NOW.timestamp(), **fields}
    return sign(body, **values)  # type: ignore[arg-type]


TEMPLATE = raw(submission(task_id="fuzz-N", queue="team-a"))
LONG = raw(submission(task_id="fuzz-N", queue="team-a", task_type="x" * 4000))


def mutated(
    rng: random.Random, number: int, used: list[tuple[bytes, list[tuple[str, bytes]]]]
) -> tuple[bytes, list[tuple[str, bytes]] | None]:
    body = TEMPLATE.replace(b"fuzz-N", b"fuzz-%d" % number)
    kind = rng.randrange(10)
    if kind == 0:  # a byte of the body changed after signing
        headers = signed(body)
        spot = rng.randrange(len(body))
        return body[:spot] + bytes([body[spot] ^ 0x01]) + body[spot + 1 :], headers
    if kind == 1:
        return body, signed(body, secret="cd" * 32)
    if kind == 2:
        return body, signed(body, key_id="k1", secret="aa" * 32)
    if kind == 3:
        return body, signed(body, key_id=f"k{rng.randrange(3, 99)}")
    if kind == 4:
        credential = signed(body)[0][1]
        return body, [(AUTH_HEADER, credential[: rng.randrange(len(credential))]), (SIGNATURE_HEADER, b"00")]
    if kind == 5 and used:
        return rng.choice(used)  # replayed: signed before, produced again
    if kind == 6:
        return body, None
    if kind == 7:
        long = LONG.replace(b"fuzz-N", b"fuzz-%d" % number)
        return long, signed(long)
    if kind == 8:
        deep = b'{"task_id": "fuzz-%d", "a": ' % number + b"[" * 5000 + b"]" * 5000 + b"}"
        return deep, signed(deep)
    junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    return junk, signed(junk, now_s=0) if rng.random() < 0.5 else signed(junk)


@pytest.mark.slow
def test_ten_thousand_mutations_each_get_one_typed_rejection_and_a_valid_job_gets_in_after() -> None:
    rng = random.Random(22)
    book = QueueBook(DEFAULT_TFLOPS, credentials=CREDENTIALS)
    used: list[tuple[bytes, list[tuple[str, bytes]]]] = []
    good = raw(submission(task_id="seed-job", queue="team-a"))
    first = signed(good)
    assert isinstance(book.on_submission(good, source="s/0/0", now=NOW, headers=first)[0], JobAccepted)
    used.append((good, first))
    answers: dict[str, RejectReason] = {}
    baseline = 0
    for number in range(1, SUBMISSIONS + 1):
        if number == SUBMISSIONS // 10:
            baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, the peak so far
        body, headers = mutated(rng, number, used)
        source = f"s/0/{number}"
        events = book.on_submission(body, source=source, now=NOW, headers=headers)
        assert len(events) == 1 and isinstance(events[0], JobRejected), (number, events)
        answers[source] = events[0].reason
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    assert len(answers) == SUBMISSIONS
    assert set(answers.values()) <= {
        RejectReason.UNAUTHENTICATED,
        RejectReason.REPLAYED,
        RejectReason.INVALID_VALUE,
        RejectReason.TOO_DEEP,
        RejectReason.MALFORMED_JSON,
        RejectReason.NOT_AN_OBJECT,
    }, set(answers.values())
    assert RejectReason.REPLAYED in answers.values() and RejectReason.UNAUTHENTICATED in answers.values()
    assert grown - baseline < 64 * 1024, f"the peak memory grew {grown - baseline} KiB over 9,000 rejections"
    after = raw(submission(task_id="after-the-flood", queue="team-a"))
    assert isinstance(book.on_submission(after, source="s/0/99999", now=NOW, headers=signed(after))[0], JobAccepted)
