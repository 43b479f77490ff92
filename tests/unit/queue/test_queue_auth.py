"""Signed submissions at the queue: a team's key, not revoked, within its time to live, once, for the team's own
queue; unsigned ones only into the anonymous queue. Every other submission is rejected with a typed reason and
nothing else happens."""

from collections.abc import Sequence

import pytest

from shardyard.events import JobAccepted, JobRejected, RejectReason
from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.queue.book import QueueBook
from shardyard.signing import AUTH_HEADER, Credentials, Refused, ReplayCache, sign, verify
from tests.unit.builders import at, raw, submission

A_OLD, A_NEW, B_KEY = "aa" * 32, "ab" * 32, "bb" * 32
CREDENTIALS = Credentials.model_validate(
    {
        "anonymous_queue": "public",
        "teams": {
            "team-a": {"keys": {"k1": {"secret": A_OLD, "revoked": True}, "k2": {"secret": A_NEW}}},
            "team-b": {"keys": {"k1": {"secret": B_KEY}}},
        },
    }
)
NOW = at(1000).timestamp()


def body(task_id: str, queue: str = "team-a") -> bytes:
    return raw(submission(task_id=task_id, queue=queue))


def signed(
    data: bytes, team: str = "team-a", key_id: str = "k2", secret: str = A_NEW, issued: float = NOW, **more: object
):  # type: ignore[no-untyped-def]
    return sign(data, team=team, key_id=key_id, secret=secret, now_s=issued, **more)  # type: ignore[arg-type]


def answer(book: QueueBook, data: bytes, headers: Sequence[tuple[str, bytes]] | None, offset: int) -> object:
    events = book.on_submission(data, source=f"shardyard.jobs.submissions/0/{offset}", now=at(1000), headers=headers)
    assert len(events) >= 1 and all(e.job_id == events[0].job_id for e in events)  # type: ignore[attr-defined]
    return events[0]


def tampered(data: bytes) -> list[tuple[str, bytes]]:
    credential, _signature = signed(data)
    return [credential, ("x-shardyard-signature", b"00" * 32)]


CASES = {
    "signed-by-its-team": (body("j1"), lambda d: signed(d), None),
    "unsigned-into-the-anonymous-queue": (body("j2", "public"), lambda d: None, None),
    "unsigned-elsewhere": (body("j3"), lambda d: None, RejectReason.UNAUTHENTICATED),
    "another-teams-queue": (body("j4", "team-b"), lambda d: signed(d), RejectReason.FORBIDDEN),
    "revoked-key": (body("j5"), lambda d: signed(d, key_id="k1", secret=A_OLD), RejectReason.UNAUTHENTICATED),
    "unknown-key": (body("j6"), lambda d: signed(d, key_id="k9"), RejectReason.UNAUTHENTICATED),
    "wrong-secret": (body("j7"), lambda d: signed(d, secret=B_KEY), RejectReason.UNAUTHENTICATED),
    "bad-signature": (body("j8"), tampered, RejectReason.UNAUTHENTICATED),
    "expired": (body("j9"), lambda d: signed(d, issued=NOW - 400), RejectReason.UNAUTHENTICATED),
    "from-the-future": (body("j10"), lambda d: signed(d, issued=NOW + 400), RejectReason.UNAUTHENTICATED),
    "credential-without-signature": (
        body("j11"), lambda d: [(AUTH_HEADER, signed(d)[0][1])], RejectReason.UNAUTHENTICATED
    ),
    "body-changed-after-signing": (body("j12"), lambda d: signed(body("other")), RejectReason.UNAUTHENTICATED),
    "credential-not-utf8": (
        body("j14"), lambda d: [(AUTH_HEADER, b"v1;team-a;k2;1;300;\xff\xfe"), ("x-shardyard-signature", b"\xff")],
        RejectReason.UNAUTHENTICATED,
    ),
    "other-team-signs-its-own": (body("j13", "team-b"), lambda d: signed(d, "team-b", "k1", B_KEY), None),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_who_may_submit(case: tuple[bytes, object, RejectReason | None]) -> None:
    data, headers_of, reason = case
    book = QueueBook(DEFAULT_TFLOPS, credentials=CREDENTIALS)

    first = answer(book, data, headers_of(data), 1)  # type: ignore[operator]

    if reason is None:
        assert isinstance(first, JobAccepted), first
    else:
        assert isinstance(first, JobRejected) and first.reason is reason, first


def test_a_signed_submission_produced_again_is_replayed() -> None:
    book = QueueBook(DEFAULT_TFLOPS, credentials=CREDENTIALS)
    data = body("once")
    headers = signed(data)
    assert isinstance(answer(book, data, headers, 1), JobAccepted)

    again = answer(book, data, headers, 2)  # the same bytes and headers at a new offset

    assert isinstance(again, JobRejected) and again.reason is RejectReason.REPLAYED

    redelivered = book.on_submission(data, source="shardyard.jobs.submissions/0/1", now=at(1001), headers=headers)
    assert redelivered == []  # the first offset read again is a redelivery: answered once already


def test_a_signature_spent_at_one_replica_is_replayed_at_another() -> None:
    # After a rebalance the replay reaches a replica that never checked the signature itself; it has read the first
    # replica's verdict from the lifecycle topic, and the verdict names the nonce it spent.
    first, other = (QueueBook(DEFAULT_TFLOPS, credentials=CREDENTIALS) for _ in range(2))
    data = body("once")
    headers = signed(data)
    accepted = answer(first, data, headers, 1)
    assert isinstance(accepted, JobAccepted)
    other.apply(accepted)

    again = answer(other, data, headers, 2)

    assert isinstance(again, JobRejected) and again.reason is RejectReason.REPLAYED, again


def test_a_signature_spent_on_a_refused_submission_is_replayed_at_another_replica() -> None:
    first, other = (QueueBook(DEFAULT_TFLOPS, credentials=CREDENTIALS) for _ in range(2))
    data = body("elsewhere", queue="team-b")  # team-a signs into team-b's queue: FORBIDDEN, the nonce spent
    headers = signed(data)
    refused = answer(first, data, headers, 1)
    assert isinstance(refused, JobRejected) and refused.reason is RejectReason.FORBIDDEN, refused
    other.apply(refused)

    again = answer(other, data, headers, 2)

    assert isinstance(again, JobRejected) and again.reason is RejectReason.REPLAYED, again


def test_without_credentials_every_submission_is_taken_as_before() -> None:
    book = QueueBook(DEFAULT_TFLOPS)

    assert isinstance(answer(book, body("plain"), None, 1), JobAccepted)


def test_the_replay_cache_forgets_expired_nonces_and_stays_bounded() -> None:
    cache = ReplayCache(limit=3)
    assert cache.first_use("a", 10, 0) and not cache.first_use("a", 10, 1)
    for nonce in "bcd":
        assert cache.first_use(nonce, 100, 5)
    assert len(cache) == 3  # "a", the oldest, dropped at the limit
    assert cache.first_use("e", 100, 50) and len(cache) == 3


def test_a_signature_covers_the_body() -> None:
    data = body("x")
    headers = signed(data)
    assert verify(data, headers, CREDENTIALS, NOW) is not None
    assert isinstance(verify(data + b" ", headers, CREDENTIALS, NOW), Refused)


def cancel_of(job_id: str, queue: str = "team-a") -> bytes:
    return f'{{"cancel": "{job_id}", "queue": "{queue}"}}'.encode()


def accepted(book: QueueBook, task_id: str, queue: str, offset: int) -> None:
    data = body(task_id, queue)
    verdict = answer(book, data, signed(data, team=queue, key_id="k1" if queue == "team-b" else "k2",
                                        secret=B_KEY if queue == "team-b" else A_NEW), offset)  # fmt: skip
    assert isinstance(verdict, JobAccepted), verdict
    book.apply(verdict)


@pytest.mark.parametrize(
    ("headers", "job", "cancelled"),
    [
        (lambda d: signed(d), "a-job", True),  # its own team
        (lambda d: signed(d, team="team-b", key_id="k1", secret=B_KEY), "a-job", False),  # another team's job
        (lambda d: None, "a-job", False),  # unsigned
        (tampered, "a-job", False),
        (lambda d: signed(d, issued=NOW - 400), "a-job", False),  # expired
        (lambda d: signed(d), "no-such-job", False),
    ],
)
def test_a_team_cancels_only_its_own_unfinished_job_through_the_queue(headers, job, cancelled) -> None:  # type: ignore[no-untyped-def]
    book = QueueBook(DEFAULT_TFLOPS, credentials=CREDENTIALS)
    accepted(book, "a-job", "team-a", 1)
    data = cancel_of(job)
    events = book.on_submission(data, source="shardyard.jobs.submissions/0/9", now=at(1000), headers=headers(data))

    if cancelled:
        [request] = events
        assert type(request).__name__ == "JobCancelRequested" and request.job_id == job  # type: ignore[attr-defined]
        assert request.requested_by == "team team-a"  # type: ignore[attr-defined]
    else:
        assert events == []


def test_a_replayed_team_cancel_is_refused() -> None:
    book = QueueBook(DEFAULT_TFLOPS, credentials=CREDENTIALS)
    accepted(book, "a-job", "team-a", 1)
    data = cancel_of("a-job")
    headers = signed(data)
    first = book.on_submission(data, source="shardyard.jobs.submissions/0/9", now=at(1000), headers=headers)
    again = book.on_submission(data, source="shardyard.jobs.submissions/0/10", now=at(1000), headers=headers)
    assert len(first) == 1 and again == []


def test_a_changed_credentials_file_is_in_force_at_the_next_poll_and_a_bad_one_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from shardyard.queue.credentials_watch import CredentialsWatch
    from shardyard.signing import read_credentials

    path = tmp_path / "credentials.yaml"
    path.write_text(f"teams:\n  team-a:\n    keys:\n      k2: {{secret: {A_NEW}}}\n")
    book = QueueBook(DEFAULT_TFLOPS, credentials=read_credentials(path))
    watch = CredentialsWatch(path, book.gate)
    assert watch.poll() is False  # unchanged
    assert isinstance(answer(book, body("r1"), signed(body("r1")), 1), JobAccepted)

    path.write_text(f"teams:\n  team-a:\n    keys:\n      k2: {{secret: {A_NEW}, revoked: true}}\n")
    assert watch.poll() is True
    refused = answer(book, body("r2"), signed(body("r2")), 2)
    assert isinstance(refused, JobRejected) and refused.reason is RejectReason.UNAUTHENTICATED

    path.write_text("teams: [not, a, mapping]\n")
    assert watch.poll() is False and watch.error is not None
    assert isinstance(answer(book, body("r3"), signed(body("r3")), 3), JobRejected)  # the revocation stays in force
