"""A consumer never dies on a bad message: it goes to the dead-letter topic and the next one is processed."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import DEADLETTER, FAILURES, LIFECYCLE, SERVICES, SHARD_EVENTS
from shardyard.events import FailureCause, JobFailed, ServiceReady, ShardFailed
from tests.support.events import Producer, Watcher
from tests.support.processes import service

pytestmark = pytest.mark.broker


async def test_undecodable_events_are_dead_lettered_and_consumption_goes_on(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    with service("shardyard.fault_manager", [], bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [LIFECYCLE, SERVICES, DEADLETTER]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="fault-manager", timeout_s=60)
            await send.raw(SHARD_EVENTS.name, b'{"type": "shard.failed", "job_id": 7}', key=b"dl-job")
            await send.raw(FAILURES.name, b"\xde\xad\xbe\xef", key=b"dl-node")
            await send.event(
                ShardFailed(
                    occurred_at=datetime.now(UTC),
                    job_id="dl-job",
                    shard_index=0,
                    attempt=1,
                    node_id="n1",
                    cause=FailureCause.USER_ERROR,
                    exit_code=3,
                    message="bad script",
                )
            )
            failed = await watch.first(JobFailed, job_id="dl-job")
            assert failed.cause is FailureCause.USER_ERROR

            def letters() -> list[dict[str, bytes]]:
                found = [headers for topic, _value, headers in watch.raw if topic == DEADLETTER.name]
                return found if len(found) >= 2 else []

            headers = await watch.until(letters, what="two dead letters")
            assert {h["x-shardyard-source"].decode().split("/")[0] for h in headers} == {
                SHARD_EVENTS.name,
                FAILURES.name,
            }
            assert all(h["x-shardyard-error"] for h in headers)
