"""Signed submissions against a real queue service on a real broker: what ``shardyard submit --credentials`` signs
is accepted; a submission for another team, an unsigned one outside the anonymous queue, one signed with a revoked
key, a forged signature and a replay of a signed one are each rejected with their typed reason, and nothing else
happens for them."""

import json
import time
from pathlib import Path

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import LIFECYCLE, SERVICES, SUBMISSIONS
from shardyard.cli.client import signature
from shardyard.events import JobAccepted, JobReady, JobRejected, RejectReason, ServiceReady
from shardyard.signing import SIGNATURE_HEADER, sign
from tests.support.events import Producer, Watcher, dumps
from tests.support.processes import service

pytestmark = pytest.mark.broker
EXAMPLE = json.loads((Path(__file__).parents[2] / "examples" / "fine_tune_gpt2.json").read_text())
CREDENTIALS = """
anonymous_queue: public
teams:
  team-a:
    keys:
      k1: {secret: %s, revoked: true}
      k2: {secret: %s}
  team-b:
    keys:
      k1: {secret: %s}
""" % ("aa" * 32, "ab" * 32, "bb" * 32)  # noqa: UP031


def job(task_id: str, queue: str) -> bytes:
    return dumps({**EXAMPLE, "task_id": task_id, "queue": queue})


def by(team: str, key_id: str, secret: str, body: bytes) -> list[tuple[str, bytes]]:
    return sign(body, team=team, key_id=key_id, secret=secret, now_s=time.time())


async def test_only_what_a_team_signs_for_its_own_queue_gets_in(bootstrap: str, log_dir: Path, tmp_path: Path) -> None:
    await ensure_topics(bootstrap)
    credentials = tmp_path / "credentials.yaml"
    credentials.write_text(CREDENTIALS)
    good, for_b, forged, revoked = (
        job("a-good", "team-a"),
        job("a-for-b", "team-b"),
        job("b-forged", "team-b"),
        job("a-revoked", "team-a"),
    )
    headers = signature(good, str(credentials))  # as `shardyard submit --credentials` signs
    sent = [
        ("a-good", good, headers),
        ("a-good", good, headers),  # the same, produced again
        ("a-for-b", for_b, by("team-a", "k2", "ab" * 32, for_b)),
        ("b-forged", forged, [by("team-b", "k1", "cc" * 32, forged)[0], (SIGNATURE_HEADER, b"0" * 64)]),
        ("a-revoked", revoked, by("team-a", "k1", "aa" * 32, revoked)),
        ("plain", job("plain", "team-a"), []),
        ("anon", job("anon", "public"), []),
    ]
    expected = {
        "a-good": RejectReason.REPLAYED,
        "a-for-b": RejectReason.FORBIDDEN,
        "b-forged": RejectReason.UNAUTHENTICATED,
        "a-revoked": RejectReason.UNAUTHENTICATED,
        "plain": RejectReason.UNAUTHENTICATED,
    }
    with service("shardyard.queue", ["--credentials-file", str(credentials)], bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [LIFECYCLE, SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="queue", timeout_s=60)
            for job_id, body, signed in sent:
                await send.raw(SUBMISSIONS.name, body, key=job_id.encode(), headers=signed or None)

            await watch.first(JobReady, job_id="a-good")
            await watch.first(JobAccepted, job_id="anon")
            for job_id, reason in expected.items():
                rejected = await watch.first(JobRejected, job_id=job_id)
                assert rejected.reason is reason, rejected
            assert {e.job_id for e in watch.of(JobAccepted)} == {"a-good", "anon"}
            assert len(watch.of(JobRejected)) == len(expected)  # one answer each
