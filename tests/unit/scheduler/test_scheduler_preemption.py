"""The scheduler book carries out preemption (stop requests, requeue, resume) and cancellation as events."""

from __future__ import annotations

from shardyard.events import (
    Event,
    JobCancelled,
    JobCancelRequested,
    JobPreempted,
    JobPreempting,
    JobReady,
    JobScheduled,
    JobUnschedulable,
    PendingReason,
    ShardAssignment,
    ShardCheckpointed,
    ShardPreempted,
    ShardRevocation,
    ShardStopRequest,
)
from shardyard.scheduler.book import SchedulerBook
from tests.unit.builders import at, completed, gpus, job_spec, node_state, started


def ready(job_id: str, when: float = 0.0, **spec: object) -> JobReady:
    return JobReady(occurred_at=at(when), job_id=job_id, spec=job_spec(job_id=job_id, **spec))


def of(events: list[Event], kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind)]


def running_low() -> tuple[SchedulerBook, JobScheduled]:
    """One node with 2 A100s, fully used by the priority-1 job "low" (RUNNING)."""
    book = SchedulerBook(preempt_deadline_s=30)
    book.apply(node_state("node-a", gpus=gpus(count=2)))
    book.apply(ready("low", priority=1))
    (scheduled,) = of(book.cycle(at(1)), JobScheduled)
    book.apply(scheduled)
    for shard in (0, 1):
        book.apply(started("low", shard))
    book.on_shard_event(at(2))
    return book, scheduled


def preempted(shard: int, step: int = 40) -> ShardPreempted:
    return ShardPreempted(
        occurred_at=at(12),
        job_id="low",
        shard_index=shard,
        attempt=1,
        node_id="node-a",
        step=step,
        checkpoint_dir="/data/checkpoints/low/checkpoint",
    )


def test_every_assignment_tells_its_shard_the_notice_the_scheduler_gives() -> None:
    book = SchedulerBook(preempt_deadline_s=12.5)
    book.apply(node_state("node-a", gpus=gpus(count=2)))
    book.apply(ready("low", priority=1))

    assignments = of(book.cycle(at(1)), ShardAssignment)

    assert [a.notice_s for a in assignments] == [12.5, 12.5]


def test_a_higher_job_asks_the_lower_gang_to_checkpoint_and_stop() -> None:
    book, _ = running_low()
    book.apply(ready("vip", when=10, priority=9))

    events = book.cycle(at(10))

    (marker,) = of(events, JobPreempting)
    assert (marker.job_id, marker.by_job, marker.attempt, marker.deadline_s) == ("low", "vip", 1, 30)
    requests = of(events, ShardStopRequest)
    assert sorted((r.shard_index, r.node_id, r.attempt) for r in requests) == [(0, "node-a", 1), (1, "node-a", 1)]
    (waiting,) = of(events, JobUnschedulable)
    assert waiting.job_id == "vip" and waiting.reason is PendingReason.PREEMPTING
    assert of(book.cycle(at(11)), ShardStopRequest) == []  # asked once


def test_when_every_shard_stopped_the_job_is_requeued_and_the_higher_one_placed() -> None:
    book, _ = running_low()
    book.apply(ready("vip", when=10, priority=9))
    book.apply(of(book.cycle(at(10)), JobPreempting)[0])
    book.apply(preempted(0))
    assert of(book.on_shard_event(at(12)), JobPreempted) == []  # shard 1 still running
    book.apply(preempted(1))

    (requeued,) = of(book.on_shard_event(at(13)), JobPreempted)
    placed = book.cycle(at(13))

    assert requeued.checkpoint_dir == "/data/checkpoints/low/checkpoint" and requeued.checkpoint_step == 40
    assert [e.job_id for e in of(placed, JobScheduled)] == ["vip"]
    assert "low" in book.pending


def test_the_requeued_job_resumes_from_its_checkpoint() -> None:
    book, _ = running_low()
    book.apply(ready("vip", when=10, priority=9))
    book.apply(of(book.cycle(at(10)), JobPreempting)[0])
    for shard in (0, 1):
        book.apply(preempted(shard))
    book.on_shard_event(at(13))
    (vip,) = of(book.cycle(at(13)), JobScheduled)
    book.apply(vip)
    for shard in (0, 1):
        book.apply(completed("vip", shard))
    book.on_shard_event(at(20))

    events = book.cycle(at(20))

    (again,) = of(events, JobScheduled)
    assert (again.job_id, again.attempt, again.resume_from) == ("low", 2, "/data/checkpoints/low/checkpoint")
    assert {a.workload.resume_from for a in of(events, ShardAssignment)} == {"/data/checkpoints/low/checkpoint"}


def test_a_gang_that_does_not_stop_by_the_deadline_is_revoked_and_requeued() -> None:
    book, _ = running_low()
    book.apply(ready("vip", when=10, priority=9))
    book.apply(of(book.cycle(at(10)), JobPreempting)[0])

    assert of(book.cycle(at(39)), JobPreempted) == []
    events = book.cycle(at(40))

    assert sorted(r.shard_index for r in of(events, ShardRevocation)) == [0, 1]
    (requeued,) = of(events, JobPreempted)
    assert requeued.checkpoint_dir is None
    assert [e.job_id for e in of(events, JobScheduled)] == ["vip"]


def test_cancel_a_pending_job() -> None:
    book = SchedulerBook()
    book.apply(ready("job-1"))

    (cancelled,) = book.on_cancel(JobCancelRequested(occurred_at=at(1), job_id="job-1"), at(1))

    assert isinstance(cancelled, JobCancelled)
    assert book.pending == {} and book.cycle(at(2)) == []


def test_cancel_a_running_job_revokes_its_shards_and_frees_its_gpus() -> None:
    book, _ = running_low()

    events = book.on_cancel(JobCancelRequested(occurred_at=at(5), job_id="low", requested_by="alice"), at(5))

    assert sorted(r.shard_index for r in of(events, ShardRevocation)) == [0, 1]
    assert of(events, JobCancelled)[0].message == "cancelled by alice"
    assert {v.node_id: v.free_gpus for v in book.snapshot().nodes} == {"node-a": (0, 1)}


def test_cancel_of_an_unknown_or_ended_job_does_nothing() -> None:
    book = SchedulerBook()

    assert book.on_cancel(JobCancelRequested(occurred_at=at(1), job_id="nope"), at(1)) == []


def test_replay_of_a_preemption_restores_the_requeue() -> None:
    _book, scheduled = running_low()
    replayed = SchedulerBook()
    replayed.apply(node_state("node-a", gpus=gpus(count=2)))
    replayed.apply(ready("low", priority=1))
    replayed.apply(scheduled)
    replayed.apply(JobPreempting(occurred_at=at(10), job_id="low", attempt=1, by_job="vip", deadline_s=30))
    replayed.apply(
        JobPreempted(occurred_at=at(13), job_id="low", attempt=1, by_job="vip", checkpoint_dir="/c", checkpoint_step=40)
    )

    assert "low" in replayed.pending and replayed.resume == {"low": "/c"}
    assert replayed.gangs == {}


def test_a_cancel_request_that_arrives_before_the_job_is_ready_is_carried_out_when_it_is() -> None:
    book = SchedulerBook()
    book.apply(node_state("node-a"))

    assert book.on_cancel(JobCancelRequested(occurred_at=at(1), job_id="job-1", requested_by="bob"), at(1)) == []
    book.apply(ready("job-1"))
    events = book.cycle(at(2))

    assert [type(e) for e in events] == [JobCancelled]
    assert of(events, JobCancelled)[0].message == "cancelled by bob"


def checkpointed(job_id: str, node_id: str, when: float, attempt: int = 1) -> ShardCheckpointed:
    return ShardCheckpointed(
        occurred_at=at(when),
        job_id=job_id,
        shard_index=0,
        attempt=attempt,
        node_id=node_id,
        step=10,
        checkpoint_dir=f"/data/checkpoints/{job_id}/checkpoint",
    )


def test_the_gang_that_checkpointed_last_of_its_attempt_is_the_one_preempted() -> None:
    """Victims by lost work, from the log: "fresh" checkpointed at 9 s, "stale" at 2 s (and "stale" holds a newer
    checkpoint of another attempt, which is not this attempt's work)."""
    book = SchedulerBook(preempt_deadline_s=30)
    for name in ("node-a", "node-b"):
        book.apply(node_state(name, gpus=gpus(count=1)))
    placed = {}
    for job_id, when in (("fresh", 0.0), ("stale", 0.5)):  # "stale" is the newer gang: the old rule took it
        book.apply(ready(job_id, when=when, priority=1, gpu_count=1))
        (scheduled,) = of(book.cycle(at(when + 0.1)), JobScheduled)
        book.apply(scheduled)
        book.apply(started(job_id, 0))
        placed[job_id] = scheduled.placements[0].node_id
    book.on_shard_event(at(1))
    book.apply(checkpointed("stale", placed["stale"], 2))
    book.apply(checkpointed("fresh", placed["fresh"], 9))
    book.apply(checkpointed("stale", placed["stale"], 9.5, attempt=7))
    book.apply(ready("vip", when=10, priority=9, gpu_count=1))

    (marker,) = of(book.cycle(at(10)), JobPreempting)

    assert marker.job_id == "fresh"
