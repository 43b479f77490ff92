"""Transport security, live: ``shardyard up`` secures its Apache Kafka (TLS, SASL/SCRAM, the ACLs of
``shardyard.broker.access``), and the broker itself refuses what the table does not grant:

- a client with no credential is refused, in plain text and over TLS alike;
- a team's principal writes submissions (``shardyard submit`` sends every job as its queue's team) but reads no
  topic and writes no other;
- the hijack of the scheduler's leadership (a client joining ``shardyard-scheduler-leader``, found on the embedded
  broker by a plain Kafka client with no key) is refused to every principal but the scheduler's own, and the leader
  keeps its term and goes on scheduling."""

import asyncio
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import GroupAuthorizationFailedError, KafkaConnectionError, TopicAuthorizationFailedError

from shardyard.bus.topics import ASSIGNMENTS, LIFECYCLE, SUBMISSIONS
from shardyard.cli.cluster import ClusterInfo, get_json
from tests.support.cluster import cli, job, local_cluster

pytestmark = [pytest.mark.slow, pytest.mark.broker]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterInfo]:
    with local_cluster(tmp_path_factory.mktemp("secured"), ("A100:2",), replicas=1) as run_dir:
        yield ClusterInfo.load(run_dir)


def as_principal(info: ClusterInfo, principal: str) -> dict[str, Any]:
    """aiokafka's options for speaking to ``info``'s broker as ``principal``."""
    access = Path(info.access_dir)
    return {
        "security_protocol": "SASL_SSL",
        "ssl_context": ssl.create_default_context(cafile=str(access / "ca.pem")),
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": principal,
        "sasl_plain_password": (access / principal).read_text().strip(),
    }


def leader(info: ClusterInfo) -> tuple[str, int]:
    elected = get_json(f"{info.live().monitor_url}/api/services")["leaders"]["scheduler"]
    return elected["instance"], elected["term"]


def test_up_secures_its_broker(cluster: ClusterInfo) -> None:
    assert cluster.broker == "kafka" and cluster.access_dir
    access = Path(cluster.access_dir)
    assert access.stat().st_mode & 0o077 == 0
    assert all((access / name).stat().st_mode & 0o077 == 0 for name in ("admin", "scheduler", "team.default"))


@pytest.mark.parametrize("transport", ["PLAINTEXT", "SSL"], ids=["plain", "tls-without-sasl"])
def test_a_client_with_no_credential_is_refused(cluster: ClusterInfo, transport: str) -> None:
    async def connect() -> None:
        options: dict[str, Any] = {"security_protocol": transport}
        if transport == "SSL":
            options["ssl_context"] = ssl.create_default_context(cafile=str(Path(cluster.access_dir) / "ca.pem"))
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, request_timeout_ms=5000, **options)
        try:
            await producer.start()
        finally:
            await producer.stop()

    with pytest.raises(KafkaConnectionError):
        asyncio.run(connect())


def test_a_team_writes_submissions_and_nothing_else(cluster: ClusterInfo) -> None:
    team = as_principal(cluster, "team.default")

    async def attempts() -> dict[str, object]:
        found: dict[str, object] = {}
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, enable_idempotence=False, **team)
        await producer.start()
        try:
            found["submission"] = await producer.send_and_wait(SUBMISSIONS.name, b"{}", key=b"x")
            with pytest.raises(TopicAuthorizationFailedError):
                await producer.send_and_wait(LIFECYCLE.name, b"{}")
        finally:
            await producer.stop()
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap, **team)
        await admin.start()
        try:
            described = await admin.describe_topics([LIFECYCLE.name, ASSIGNMENTS.name])
            found["described"] = {topic["topic"]: topic["error_code"] for topic in described}
        finally:
            await admin.close()
        return found

    found = asyncio.run(attempts())
    assert found["described"] == {LIFECYCLE.name: 29, ASSIGNMENTS.name: 29}  # TOPIC_AUTHORIZATION_FAILED
    assert found["submission"].topic == SUBMISSIONS.name  # what it may do, the broker took


@pytest.mark.parametrize(
    ("principal", "topic", "refusal"),
    [
        ("node-agent", ASSIGNMENTS.name, GroupAuthorizationFailedError),  # it may read the topic, not join the group
        ("team.default", SUBMISSIONS.name, GroupAuthorizationFailedError),  # the group is checked first
        ("monitor", LIFECYCLE.name, GroupAuthorizationFailedError),  # another service's
    ],
    ids=["agent", "team", "another-service"],
)
def test_nobody_but_the_scheduler_joins_its_leadership_group(
    cluster: ClusterInfo, principal: str, topic: str, refusal: type[Exception]
) -> None:
    before = leader(cluster)

    async def hijack() -> None:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=cluster.bootstrap,
            group_id="shardyard-scheduler-leader",
            **as_principal(cluster, principal),
        )
        try:
            await consumer.start()
            await asyncio.wait_for(consumer.getmany(timeout_ms=3000), 20)
        finally:
            await consumer.stop()

    with pytest.raises(refusal):
        asyncio.run(hijack())
    assert leader(cluster) == before
    run_dir = Path(cluster.run_dir)
    task = f"after-hijack-{principal.replace('.', '-')}"
    done = cli("submit", "-", "--wait", "--timeout", "240", run_dir=run_dir, stdin=job(task, max_steps=5), timeout=300)
    status = json.loads(cli("status", task, "--json", run_dir=run_dir).stdout)
    assert status["state"] == "SUCCEEDED", done.stdout + done.stderr
    assert leader(cluster) == before
