"""The queues file read by a real queue service on a real broker: published on the queues topic once, enforced at
admission (UNKNOWN_QUEUE), reloaded on change without a restart, and a bad file refused with its line while the
configuration in force stays."""

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


async def until_answer(watch: Watcher, send: Producer, prefix: str, wanted: Callable[[object], bool]) -> Any:
    """Submit team-b jobs one at a time (``prefix-0``, ``prefix-1``...) until one's verdict is ``wanted``."""
    deadline = time.monotonic() + 30
    for attempt in range(1000):
        task_id = f"{prefix}-{attempt}"
        await send.raw(SUBMISSIONS.name, job(task_id, "team-b"), key=task_id.encode())
        verdict = await watch.until(
            lambda t=task_id: [*watch.of(JobAccepted, job_id=t), *watch.of(JobRejected, job_id=t)]
        )
        verdict = verdict[0]
        if wanted(verdict):
            return verdict
        assert time.monotonic() < deadline, f"no wanted verdict within 30 s; the last: {verdict}"
    raise AssertionError("no wanted verdict")


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

            # In force once the replica has read it from the topic: a submission read before is judged without it.
            refused = await until_answer(watch, send, "b-1", lambda e: isinstance(e, JobRejected))
            assert refused.reason is RejectReason.UNKNOWN_QUEUE and "team-a" in refused.message

            path.write_text(BAD)
            await eventually(lambda: asyncio.to_thread(refused_in_log, log_dir), "the bad file refused, its line")
            await send.raw(SUBMISSIONS.name, job("b-2", "team-b"), key=b"b-2")
            still = await watch.first(JobRejected, job_id="b-2")
            assert still.reason is RejectReason.UNKNOWN_QUEUE  # the last good configuration is in force

            path.write_text(SECOND)
            second = await watch.first(QueuesConfigured, version=version_of(SECOND), timeout_s=30)
            assert sorted(second.config.queues) == ["team-a", "team-b"]
            accepted = await until_answer(watch, send, "b-3", lambda e: isinstance(e, JobAccepted))
            assert accepted.spec.queue == "team-b"
            assert len(watch.of(QueuesConfigured)) == 2  # each good text published once; the bad one never
