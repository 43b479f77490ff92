"""The queue as a real process on a real broker: valid jobs are accepted, bad input is rejected with a reason,
and the queue keeps consuming after bad input."""

import json
from pathlib import Path

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import DEADLETTER, LIFECYCLE, SERVICES, SUBMISSIONS
from shardyard.events import JobAccepted, JobReady, JobRejected, RejectReason, ServiceReady
from tests.support.events import Producer, Watcher, dumps
from tests.support.processes import service

pytestmark = pytest.mark.broker
EXAMPLE = json.loads((Path(__file__).parents[2] / "examples" / "fine_tune_gpt2.json").read_text())


def variant(task_id: str, **changes: object) -> dict[str, object]:
    document = json.loads(json.dumps(EXAMPLE))
    document["task_id"] = task_id
    for path, value in changes.items():
        target = document
        *parents, leaf = path.split("__")
        for part in parents:
            target = target[part]
        if value is None:
            del target[leaf]
        else:
            target[leaf] = value
    return document


BAD_INPUTS = [
    pytest.param(b"\x00\xffnot json at all", RejectReason.MALFORMED_JSON, id="non-json-bytes"),
    pytest.param(dumps(variant("q-missing", dependencies=None)), RejectReason.MISSING_FIELD, id="missing-field"),
    pytest.param(
        dumps(variant("q-type", resource_requirements__gpu__count="two")), RejectReason.WRONG_TYPE, id="wrong-type"
    ),
    pytest.param(
        dumps(variant("q-zero", resource_requirements__gpu__count=0, shard_count=None)),
        RejectReason.INVALID_VALUE,
        id="count-zero",
    ),
    pytest.param(
        dumps(variant("q-model", resource_requirements__gpu__model="Z900", resource_requirements__gpu__min_flops=None)),
        RejectReason.UNKNOWN_GPU_MODEL,
        id="unknown-model-without-min-flops",
    ),
]


async def test_rejections_then_a_valid_job_is_still_accepted(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    with service("shardyard.queue", [], bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [LIFECYCLE, SERVICES, DEADLETTER]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="queue", timeout_s=60)
            offsets = []
            for raw, _reason in (p.values for p in BAD_INPUTS):
                offsets.append(await send.raw(SUBMISSIONS.name, raw))
            await send.raw(SUBMISSIONS.name, dumps(variant("q-good")), key=b"q-good")

            accepted = await watch.first(JobAccepted, job_id="q-good")
            await watch.first(JobReady, job_id="q-good")
            assert accepted.spec.memory_bytes == 64 * 1024**3
            assert accepted.spec.min_tflops == 35

            rejections = await watch.until(
                lambda: len(watch.of(JobRejected)) >= len(BAD_INPUTS) and watch.of(JobRejected)
            )
            by_source = {r.source_offset: r for r in rejections}
            for meta, param in zip(offsets, BAD_INPUTS, strict=True):
                rejection = by_source[f"{SUBMISSIONS.name}/{meta.partition}/{meta.offset}"]
                assert rejection.reason is param.values[1], rejection
                assert rejection.message
            non_json = by_source[f"{SUBMISSIONS.name}/{offsets[0].partition}/{offsets[0].offset}"]
            assert non_json.job_id == f"invalid-{offsets[0].partition}-{offsets[0].offset}"
            zero = next(r for r in rejections if r.job_id == "q-zero")
            assert any(e.field == "resource_requirements.gpu.count" for e in zero.errors)


async def test_duplicate_submission_and_redelivery(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    with service("shardyard.queue", [], bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [LIFECYCLE, SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="queue", timeout_s=60)
            await send.raw(SUBMISSIONS.name, dumps(variant("q-dup")), key=b"q-dup")
            await watch.first(JobAccepted, job_id="q-dup")
            await send.raw(SUBMISSIONS.name, dumps(variant("q-dup")), key=b"q-dup")
            duplicate = await watch.first(JobRejected, job_id="q-dup")
            assert duplicate.reason is RejectReason.DUPLICATE_JOB
            assert len(watch.of(JobAccepted, job_id="q-dup")) == 1


async def test_a_restarted_queue_does_not_admit_a_submission_twice(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    async with Watcher(bootstrap, [LIFECYCLE, SERVICES]) as watch, Producer(bootstrap) as send:
        with service("shardyard.queue", ["--instance", "q-1"], bootstrap=bootstrap, log_dir=log_dir):
            await watch.until(lambda: watch.of(ServiceReady, instance="q-1"), timeout_s=60)
            await send.raw(SUBMISSIONS.name, dumps(variant("q-restart")), key=b"q-restart")
            await watch.first(JobReady, job_id="q-restart")
        with service("shardyard.queue", ["--instance", "q-2"], bootstrap=bootstrap, log_dir=log_dir):
            await watch.until(lambda: watch.of(ServiceReady, instance="q-2"), timeout_s=60)
            await send.raw(SUBMISSIONS.name, dumps(variant("q-after")), key=b"q-after")
            await watch.first(JobReady, job_id="q-after")
    assert len(watch.of(JobAccepted, job_id="q-restart")) == 1
    assert not watch.of(JobRejected, job_id="q-restart")
