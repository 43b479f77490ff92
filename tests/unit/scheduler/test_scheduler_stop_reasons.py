"""Every shard the scheduler stops carries a typed reason (``RevocationReason``, ``StopReason``) and, alongside it,
the human message it has always shown. One row per path that stops shards."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

import pytest
from pydantic import ValidationError

from shardyard.events import (
    Event,
    FailureCause,
    JobCancelRequested,
    JobFailed,
    JobReady,
    JobRecovering,
    JobScheduled,
    RevocationReason,
    ShardCause,
    ShardRevocation,
    ShardStopRequest,
    StopReason,
)
from shardyard.events.job import Elasticity
from shardyard.scheduler import preemption
from shardyard.scheduler.book import SchedulerBook
from shardyard.scheduler.cancellation import cancellation
from shardyard.scheduler.completion import succeeded
from shardyard.scheduler.fencing import stale_revocations
from shardyard.scheduler.gang import Gang
from shardyard.scheduler.orphans import orphan_failure
from shardyard.scheduler.start_deadline import start_timeout
from tests.unit.builders import at, completed, gpus, job_spec, node_state, placement, scheduled, started


def gang(*, spare: bool = False) -> Gang:
    """job-1's attempt 1: two training shards on node-a (and a spare on node-b)."""
    placements = (placement(0), placement(1), *([placement(2, "node-b").model_copy(update={"spare": True})] * spare))
    return Gang(job_spec(), scheduled(placements=placements))


def placed_book() -> tuple[SchedulerBook, JobScheduled]:
    book = SchedulerBook(term=3)
    for node_id in ("n1", "n2"):
        book.apply(node_state(node_id, gpus=gpus(count=1)))
    book.apply(JobReady(occurred_at=at(0), job_id="job-1", spec=job_spec(memory_bytes=0, cpu_cores=1.0)))
    (placed,) = [e for e in book.cycle(at(1)) if isinstance(e, JobScheduled)]
    return book, placed


def fenced() -> Sequence[Event]:
    return stale_revocations(scheduled(term=2), None, term=3, now=at(5))


def overdue_start() -> Sequence[Event]:
    return start_timeout(gang(), placement(1), term=3, deadline_s=60, now=at(61))


def orphan() -> Sequence[Event]:
    found = gang()
    found.unlisted[1] = at(61)
    return orphan_failure(found, placement(1), term=3, grace_s=30, now=at(95))


def preemption_overdue() -> Sequence[Event]:
    victim = gang()
    victim.preempted_by = "vip"
    return preemption.revoke_overdue(victim, term=3, now=at(40))


def recovery() -> Sequence[Event]:
    book, placed = placed_book()
    cause = ShardCause(shard_index=0, node_id=placed.placements[0].node_id, cause=FailureCause.KILLED, message="k")
    plan = JobRecovering(
        occurred_at=at(5),
        job_id="job-1",
        attempt=1,
        cause=FailureCause.KILLED,
        message="m",
        causes=(cause,),
        retry_at=at(10),  # a backoff: nothing is re-formed, only the failed attempt stopped
        retries_used=1,
        retries_left=2,
    )
    return book.on_recovering(plan, at(5))


def resizing() -> Sequence[Event]:
    """An elastic job at 1 shard of its 2 grows into the second node's GPU: its shard stops to re-form."""
    book = SchedulerBook(term=3, resize_cooldown_s=10)
    for node_id in ("n1", "n2"):
        book.apply(node_state(node_id, gpus=gpus(count=1)))
    spec = job_spec(gpu_count=1, memory_bytes=0, cpu_cores=1.0, elasticity=Elasticity(min_shards=1, max_shards=2))
    book.apply(JobReady(occurred_at=at(0), job_id="job-1", spec=spec))
    (placed,) = [e for e in book.cycle(at(1)) if isinstance(e, JobScheduled)]
    book.apply(started(shard_index=0, node_id=placed.placements[0].node_id))
    book.on_shard_event(at(2))
    return book.cycle(at(20))


def cancel() -> Sequence[Event]:
    request = JobCancelRequested(occurred_at=at(5), job_id="job-1", requested_by="alice")
    revoked, _ = cancellation(request, gang(), term=3, now=at(5))
    return revoked


def job_failed() -> Sequence[Event]:
    book, _ = placed_book()
    failure = JobFailed(occurred_at=at(5), job_id="job-1", attempt=1, cause=FailureCause.USER_ERROR, message="bad")
    return book.revocations(failure, at(5))


def job_succeeded() -> Sequence[Event]:
    done = gang(spare=True)
    for shard in (0, 1):
        done.completed[shard] = completed(shard_index=shard)
    return succeeded(done, term=3, now=at(9))


def stop_for_preemption() -> Sequence[Event]:
    _, requests = preemption.preempting(gang(), "vip", term=3, deadline_s=30, now=at(5))
    return requests


@pytest.mark.parametrize(
    ("stopping", "reason", "message"),
    [
        pytest.param(
            fenced,
            RevocationReason.STALE_PLACEMENT,
            "placement of attempt 1 under term 2 is fenced: term 3 leads",
            id="stale-placement",
        ),
        pytest.param(
            overdue_start,
            RevocationReason.START_TIMEOUT,
            "start deadline: not reported started within 60s of its assignment (attempt 1): revoked",
            id="start-timeout",
        ),
        pytest.param(
            orphan,
            RevocationReason.ORPHANED,
            "orphaned: node node-a has not reported the shard running for 34s (grace 30s), past its start deadline "
            "(attempt 1): revoked, its GPUs freed",
            id="orphaned",
        ),
        pytest.param(
            preemption_overdue,
            RevocationReason.PREEMPTION_TIMEOUT,
            "preempted by vip: no checkpoint in time",
            id="preemption-timeout",
        ),
        pytest.param(recovery, RevocationReason.RECOVERING, "recovering: KILLED", id="recovering"),
        pytest.param(
            resizing, RevocationReason.RESIZING, "1 -> 2 shards: free GPUs no waiting job can use", id="resizing"
        ),
        pytest.param(cancel, RevocationReason.CANCELLED, "cancelled by alice", id="cancelled"),
        pytest.param(job_failed, RevocationReason.JOB_FAILED, "job failed: USER_ERROR", id="job-failed"),
        pytest.param(
            job_succeeded, RevocationReason.JOB_SUCCEEDED, "job succeeded: spare released", id="job-succeeded"
        ),
        pytest.param(stop_for_preemption, StopReason.PREEMPTED, "preempted by vip", id="stop-for-preemption"),
    ],
)
def test_every_stopped_shard_carries_its_typed_reason_and_message(
    stopping: Callable[[], Sequence[Event]], reason: RevocationReason | StopReason, message: str
) -> None:
    stops = [e for e in stopping() if isinstance(e, ShardRevocation | ShardStopRequest)]

    assert stops
    assert {(s.reason, s.message) for s in stops} == {(reason, message)}


def test_every_revocation_reason_is_produced_by_some_path() -> None:
    produced = {
        e.reason
        for path in (
            fenced,
            overdue_start,
            orphan,
            preemption_overdue,
            recovery,
            resizing,
            cancel,
            job_failed,
            job_succeeded,
        )
        for e in path()
        if isinstance(e, ShardRevocation)
    }

    assert produced == set(RevocationReason)


def test_a_reason_reads_as_its_name_in_logs_and_on_the_wire() -> None:
    (revocation,) = [e for e in overdue_start() if isinstance(e, ShardRevocation)]

    assert str(revocation.reason) == "START_TIMEOUT"  # what logging prints for "%s" (the node agent logs it)
    assert revocation.model_dump(mode="json")["reason"] == "START_TIMEOUT"
    assert ShardRevocation.model_validate_json(revocation.model_dump_json()) == revocation


def test_a_free_text_reason_is_refused() -> None:
    fields = {"occurred_at": at(1), "job_id": "j", "shard_index": 0, "node_id": "n", "attempt": 1, "term": 1}

    with pytest.raises(ValidationError):
        ShardRevocation(**fields, reason="preempted by vip")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        ShardStopRequest(**fields, reason="preempted by vip")  # type: ignore[arg-type]
    assert ShardStopRequest(**fields, reason=StopReason.PREEMPTED).message == ""  # the message is optional


def test_a_stop_request_goes_to_each_training_shard_not_completed_and_never_to_a_spare() -> None:
    victim = gang(spare=True)
    victim.completed[1] = completed(shard_index=1)

    marker, requests = preemption.preempting(victim, "vip", term=3, deadline_s=30, now=at(5))

    assert [(r.shard_index, r.node_id, r.attempt, r.term) for r in requests] == [(0, "node-a", 1, 3)]
    assert (marker.job_id, marker.attempt, marker.by_job, marker.deadline_s) == ("job-1", 1, "vip", 30)
    victim.record(marker)
    assert victim.preempt_deadline == at(5) + timedelta(seconds=30)
