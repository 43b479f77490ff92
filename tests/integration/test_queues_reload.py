"""The queues file read by a real queue service on a real broker: published on the queues topic once, enforced at
admission (UNKNOWN_QUEUE), reloaded on change without a restart, and a bad file refused with its line while the
configuration in force stays."""

import asyncio
import json
from pathlib import Path

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import LIFECYCLE, QUEUES, SERVICES, SUBMISSIONS
from shardyard.events import JobAccepted, JobRejected, QueuesConfigured, RejectReason, ServiceReady
from shardyard.queues_file import version_of
from tests.support.events import Producer, Watcher, dumps, eventually
from tests.support.processes import service

pytestmark = pytest.mark.broker
EXAMPLE = json.loads((Path(__file__).parents[2] / "examples" / "fine_tune_gpt2.json").read_text())
FIRST = "queues:\n  team-a: {gpus: {A100: 4}}\n"
BAD = "queues:\n  team-a: {gpus: {A100: 4}}\n  team-b: {gpus: {A100: four}}\n"
SECOND = "queues:\n  team-a: {gpus: {A100: 4}}\n  team-b: {gpus: {A100: 2}}\n"


def refused_in_log(log_dir: Path) -> bool:
    return any("refused" in log.read_text() and "line 3" in log.read_text() for log in log_dir.glob("queue-*.log"))


def job(task_id: str, queue: str) -> bytes:
    return dumps({**EXAMPLE, "task_id": task_id, "queue": queue})


async def test_a_reload_takes_effect_without_a_restart_and_a_bad_file_keeps_the_last_good(
    bootstrap: str, log_dir: Path, tmp_path: Path
) -> None:
    await ensure_topics(bootstrap)
    path = tmp_path / "queues.yaml"
    path.write_text(FIRST)
    with service("shardyard.queue", ["--queues-file", str(path)], bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [LIFECYCLE, SERVICES, QUEUES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="queue", timeout_s=60)
            first = await watch.first(QueuesConfigured, version=version_of(FIRST), timeout_s=30)
            assert sorted(first.config.queues) == ["team-a"]

            await send.raw(SUBMISSIONS.name, job("b-1", "team-b"), key=b"b-1")
            refused = await watch.first(JobRejected, job_id="b-1")
            assert refused.reason is RejectReason.UNKNOWN_QUEUE and "team-a" in refused.message

            path.write_text(BAD)
            await eventually(lambda: asyncio.to_thread(refused_in_log, log_dir), "the bad file refused, its line")
            await send.raw(SUBMISSIONS.name, job("b-2", "team-b"), key=b"b-2")
            still = await watch.first(JobRejected, job_id="b-2")
            assert still.reason is RejectReason.UNKNOWN_QUEUE  # the last good configuration is in force

            path.write_text(SECOND)
            second = await watch.first(QueuesConfigured, version=version_of(SECOND), timeout_s=30)
            assert sorted(second.config.queues) == ["team-a", "team-b"]
            await send.raw(SUBMISSIONS.name, job("b-3", "team-b"), key=b"b-3")
            accepted = await watch.first(JobAccepted, job_id="b-3")
            assert accepted.spec.queue == "team-b"
            assert len(watch.of(QueuesConfigured)) == 2  # each good text published once; the bad one never
