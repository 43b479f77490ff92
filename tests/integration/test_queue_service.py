"""The queue as a real process on a real broker: valid jobs are accepted, bad input is rejected with a reason,
the queue keeps consuming after bad input, and jobs wait for, are released by and fail with their dependencies; two
replicas split the jobs, and one takes them all over when the other dies."""

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.replay import replay
from shardyard.bus.topics import DEADLETTER, LIFECYCLE, SERVICES, SUBMISSIONS, partition_of
from shardyard.events import (
    Event,
    FailureCause,
    JobAccepted,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobReady,
    JobRejected,
    JobScheduled,
    JobSucceeded,
    JobWaiting,
    PendingReason,
    RejectReason,
    ServiceReady,
    ShardPlacement,
)
from tests.support.events import Producer, Watcher, dumps
from tests.support.processes import service
from tests.support.replicas import one_key_per_partition, two_replicas

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


COMMENTED_SEED = b"""{
  // the seed's example as the seed wrote it, with comments: not JSON
  "task_id": "fine_tune_gpt2",
  "task_type": "fine_tune",
  "resource_requirements": {"gpu": {"count": 2, "model": "A100", "min_flops": 35}}
}"""


async def test_a_rejection_is_filed_under_the_job_its_bytes_or_its_key_name(bootstrap: str, log_dir: Path) -> None:
    """The seed's commented example, keyed with its task_id as a Kafka client would, is REJECTED MALFORMED_JSON as
    fine_tune_gpt2 (line and column in the message); unkeyed, under the id its bytes name; bytes that name none but
    a key that is an id, under the key; neither, under ``invalid-PARTITION-OFFSET``."""
    await ensure_topics(bootstrap)
    with service("shardyard.queue", [], bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [LIFECYCLE, SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="queue", timeout_s=60)
            await send.raw(SUBMISSIONS.name, COMMENTED_SEED, key=b"fine_tune_gpt2")
            seed = await watch.first(JobRejected, job_id="fine_tune_gpt2")
            assert seed.reason is RejectReason.MALFORMED_JSON
            assert "line 2 column 3" in seed.message, seed.message
            await send.raw(SUBMISSIONS.name, COMMENTED_SEED.replace(b"fine_tune_gpt2", b"q-unkeyed"))
            assert (await watch.first(JobRejected, job_id="q-unkeyed")).reason is RejectReason.MALFORMED_JSON
            await send.raw(SUBMISSIONS.name, b"[1, 2]", key=b"q-keyed-array")
            assert (await watch.first(JobRejected, job_id="q-keyed-array")).reason is RejectReason.NOT_AN_OBJECT
            nameless = await send.raw(SUBMISSIONS.name, b"\x00 no id", key=b"not an id!")
            found = await watch.first(JobRejected, job_id=f"invalid-{nameless.partition}-{nameless.offset}")
            assert found.reason is RejectReason.MALFORMED_JSON


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


async def test_a_submission_read_late_was_submitted_when_it_reached_the_log(bootstrap: str, log_dir: Path) -> None:
    """No queue runs when the job is submitted (a replica died): it waits unread, and its life counts from the log."""
    await ensure_topics(bootstrap)
    async with Watcher(bootstrap, [LIFECYCLE, SERVICES]) as watch, Producer(bootstrap) as send:
        written = await send.raw(SUBMISSIONS.name, dumps(variant("q-late")), key=b"q-late")
        appended = datetime.fromtimestamp(written.timestamp / 1000, UTC)
        await asyncio.sleep(3)  # the time the submission waits unread: the fault itself, not a wait on a condition
        with service("shardyard.queue", ["--instance", "q-late"], bootstrap=bootstrap, log_dir=log_dir):
            accepted = await watch.first(JobAccepted, job_id="q-late", timeout_s=60)
    lag = (accepted.occurred_at - accepted.spec.submitted_at).total_seconds()
    assert abs((accepted.spec.submitted_at - appended).total_seconds()) < 0.5, (accepted.spec.submitted_at, appended)
    assert lag >= 3, lag


def _ran(job_id: str, attempt: int = 1) -> list[Event]:
    """What the scheduler and the agents would publish for a job that was placed and then succeeded."""
    now = datetime.now(UTC)
    placement = ShardPlacement(shard_index=0, node_id="n1", gpu_indices=(0,), gpu_model="A100", match_score=1.0)
    return [
        JobScheduled(
            occurred_at=now,
            job_id=job_id,
            attempt=attempt,
            term=1,
            coordinator_node="n1",
            rendezvous_port=29500,
            placements=(placement,),
        ),
        JobSucceeded(occurred_at=now, job_id=job_id, attempt=attempt, final_loss=1.0, checkpoint_dir=None),
    ]


async def test_dependencies_hold_release_and_fail(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    with service("shardyard.queue", [], bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [LIFECYCLE, SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="queue", timeout_s=60)
            for task_id in ("d-parent", "d-doomed"):
                await send.raw(SUBMISSIONS.name, dumps(variant(task_id)), key=task_id.encode())
                await watch.first(JobReady, job_id=task_id)
            await send.raw(SUBMISSIONS.name, dumps(variant("d-orphan", depends_on=["d-ghost"])), key=b"d-orphan")
            await send.raw(SUBMISSIONS.name, dumps(variant("d-child", depends_on=["d-parent"])), key=b"d-child")
            await send.raw(SUBMISSIONS.name, dumps(variant("d-fails", depends_on=["d-doomed"])), key=b"d-fails")
            await send.raw(
                SUBMISSIONS.name,
                dumps(variant("d-held", depends_on=["d-doomed"], on_dependency_failure="hold")),
                key=b"d-held",
            )

            orphan = await watch.first(JobRejected, job_id="d-orphan")
            assert orphan.reason is RejectReason.UNKNOWN_DEPENDENCY and "d-ghost" in orphan.message
            waiting = await watch.first(JobWaiting, job_id="d-child")
            assert (waiting.reason, waiting.waiting_for) == (PendingReason.WAITING_FOR_DEPENDENCY, ("d-parent",))
            await watch.first(JobWaiting, job_id="d-held")

            for event in _ran("d-parent"):
                await send.event(event)
            await send.event(
                JobFailed(
                    occurred_at=datetime.now(UTC),
                    job_id="d-doomed",
                    attempt=0,
                    cause=FailureCause.LAUNCH_ERROR,
                    message="could not start",
                )
            )

            ready = await watch.first(JobReady, job_id="d-child")
            assert ready.spec.depends_on == ("d-parent",)
            failed = await watch.first(JobFailed, job_id="d-fails")
            assert failed.cause is FailureCause.DEPENDENCY_FAILED and "d-doomed" in failed.message
            held = await watch.until(
                lambda: watch.of(JobWaiting, job_id="d-held", reason=PendingReason.DEPENDENCY_FAILED)
            )
            assert held[0].waiting_for == ("d-doomed",)

            await send.event(JobCancelRequested(occurred_at=datetime.now(UTC), job_id="d-held", requested_by="test"))
            cancelled = await watch.first(JobCancelled, job_id="d-held")
            assert "test" in cancelled.message
            # A READY job is the scheduler's to cancel. The child's end, behind the request in the child's
            # partition, releases a grandchild: once that shows, the queue has answered the request (or not).
            await send.raw(
                SUBMISSIONS.name, dumps(variant("d-grandchild", depends_on=["d-child"])), key=b"d-grandchild"
            )
            await watch.first(JobWaiting, job_id="d-grandchild")
            await send.event(JobCancelRequested(occurred_at=datetime.now(UTC), job_id="d-child", requested_by="test"))
            for event in _ran("d-child"):
                await send.event(event)
            await watch.first(JobReady, job_id="d-grandchild")
            log: list[Event] = []
            await replay(bootstrap, [LIFECYCLE], lambda _topic, event: log.append(event))
            assert not [e for e in log if isinstance(e, JobCancelled) and e.job_id == "d-child"]
            assert len([e for e in log if isinstance(e, JobReady) and e.job_id == "d-child"]) == 1


async def test_a_restarted_queue_releases_what_it_missed(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    async with Watcher(bootstrap, [LIFECYCLE, SERVICES]) as watch, Producer(bootstrap) as send:
        with service("shardyard.queue", ["--instance", "r-1"], bootstrap=bootstrap, log_dir=log_dir):
            await watch.until(lambda: watch.of(ServiceReady, instance="r-1"), timeout_s=60)
            await send.raw(SUBMISSIONS.name, dumps(variant("r-parent")), key=b"r-parent")
            await watch.first(JobReady, job_id="r-parent")
            await send.raw(SUBMISSIONS.name, dumps(variant("r-child", depends_on=["r-parent"])), key=b"r-child")
            await watch.first(JobWaiting, job_id="r-child")
        for event in _ran("r-parent"):  # the parent ends while no queue runs
            await send.event(event)
        with service("shardyard.queue", ["--instance", "r-2"], bootstrap=bootstrap, log_dir=log_dir):
            await watch.until(lambda: watch.of(ServiceReady, instance="r-2"), timeout_s=60)
            await watch.first(JobReady, job_id="r-child")
            await send.raw(SUBMISSIONS.name, dumps(variant("r-last")), key=b"r-last")
            await watch.first(JobReady, job_id="r-last")
    log: list[Event] = []
    await replay(bootstrap, [LIFECYCLE], lambda _topic, event: log.append(event))
    assert len([e for e in log if isinstance(e, JobReady) and e.job_id == "r-child"]) == 1


async def test_two_replicas_split_the_jobs_and_one_takes_them_all_over_when_the_other_dies(
    bootstrap: str, log_dir: Path
) -> None:
    await ensure_topics(bootstrap)
    run = uuid4().hex[:8]

    def child_of(job_id: str) -> str:
        """A child of ``job_id`` whose submissions partition is another one."""
        return next(
            child
            for child in (f"{job_id}-child-{k}" for k in range(100))
            if partition_of(child, SUBMISSIONS) != partition_of(job_id, SUBMISSIONS)
        )

    async def submit_each_twice(jobs: dict[int, str]) -> None:
        """Each job twice: unkeyed on the next partition (forwarded to its own), then keyed. Whichever copy comes
        first is accepted, the other is a duplicate: one replica decides a job id, however it is submitted. Each
        job's child, in another partition, waits for it and is released when it ends."""
        for partition, job_id in jobs.items():
            await send.raw(SUBMISSIONS.name, dumps(variant(job_id)), partition=(partition + 1) % SUBMISSIONS.partitions)
            await send.raw(SUBMISSIONS.name, dumps(variant(job_id)), key=job_id.encode())
        for job_id in jobs.values():
            await watch.first(JobReady, job_id=job_id, timeout_s=30)
            rejected = await watch.first(JobRejected, job_id=job_id, timeout_s=30)
            assert rejected.reason is RejectReason.DUPLICATE_JOB
            child = child_of(job_id)
            await send.raw(SUBMISSIONS.name, dumps(variant(child, depends_on=[job_id])), key=child.encode())
            await watch.first(JobWaiting, job_id=child, timeout_s=30)
        for job_id in jobs.values():
            for event in _ran(job_id):
                await send.event(event)
        for job_id in jobs.values():
            await watch.first(JobReady, job_id=child_of(job_id), timeout_s=30)

    async with Watcher(bootstrap, [LIFECYCLE, SERVICES]) as watch, Producer(bootstrap) as send:
        split = two_replicas(
            "shardyard.queue", f"qs-{run}", SUBMISSIONS, bootstrap=bootstrap, log_dir=log_dir, watch=watch
        )
        async with split as replicas:
            before = one_key_per_partition(f"qs-before-{run}", SUBMISSIONS)
            await submit_each_twice(before)
            assert replicas.both_published(LIFECYCLE)  # both replicas decided

            await replicas.kill_the_first(watch)
            after = one_key_per_partition(f"qs-after-{run}", SUBMISSIONS)
            await submit_each_twice(after)

    for job_id in [*before.values(), *after.values()]:
        for decided in (JobAccepted, JobReady, JobRejected):
            assert len(watch.of(decided, job_id=job_id)) == 1, f"{job_id}: {decided.__name__} not exactly once"
        assert len(watch.of(JobReady, job_id=child_of(job_id))) == 1


async def test_a_header_value_that_is_not_utf8_stops_no_submission(bootstrap: str, log_dir: Path) -> None:
    """FastStream decodes header values as UTF-8: one that is not failed the queue's whole batch, at every
    redelivery, and the queue answered nothing after it (found by the hostile flood's garbage credentials)."""
    await ensure_topics(bootstrap)
    with service("shardyard.queue", [], bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [LIFECYCLE, SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="queue", timeout_s=60)
            junk = [("x-junk", b"\xff\xfe not utf-8"), ("traceparent", b"\x80")]
            await send.raw(SUBMISSIONS.name, dumps(variant("q-junk")), key=b"q-junk", headers=junk)
            await send.raw(SUBMISSIONS.name, dumps(variant("q-after")), key=b"q-junk")  # same partition, after it

            await watch.first(JobAccepted, job_id="q-junk")
            await watch.first(JobAccepted, job_id="q-after")
