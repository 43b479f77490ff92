"""The accounting book's fold, pure: each job's lifecycle gives one record (times, wait, run time, GPU-hours,
attempts, result and reason, the one final loss); late, duplicated and fenced facts change nothing; the same log read
twice gives the same records."""

from dataclasses import replace
from datetime import timedelta

import pytest

from shardyard.accounting.book import AccountingBook, stranded
from shardyard.events import (
    FailureCause,
    JobAccepted,
    JobFailed,
    JobPreempted,
    JobRejected,
    JobRunning,
    JobSucceeded,
    JobUnschedulable,
    PendingReason,
    RejectReason,
    ShardFailed,
    ShardProgress,
    UsedSignature,
)
from shardyard.jobdb.record import JobRecord
from shardyard.lifecycle import JobState
from tests.support.accounting import STORIES, accepted, expected, placed, succeeded
from tests.unit.builders import T0, at, progress, started


def records(events: list[object]) -> dict[str, JobRecord]:
    book = AccountingBook()
    for event in events:
        if isinstance(event, ShardProgress | ShardFailed):
            book.on_shard(event)
        else:
            book.apply(event)  # type: ignore[arg-type]
    return {record.job_id: record for record in book.take_changed()}


@pytest.mark.parametrize("story", sorted(STORIES), ids=str)
def test_each_lifecycle_gives_its_record(story: str) -> None:
    assert records(STORIES[story]("job-1", T0)) == {"job-1": expected(story, "job-1", T0)}


def test_the_same_log_read_twice_gives_the_same_records() -> None:
    log = [event for story in STORIES.values() for event in story(f"job-{story.__name__}", T0)]
    once = records(log)
    twice = records(log + log)  # every event redelivered after the whole log: nothing moves
    assert twice == once


def test_a_duplicated_or_late_fact_changes_nothing() -> None:
    events = succeeded("job-1", T0)
    late = [
        events[2],  # the placement again
        JobRunning(occurred_at=at(4000), job_id="job-1", attempt=1),
        JobFailed(occurred_at=at(4000), job_id="job-1", attempt=1, cause=FailureCause.KILLED, message="late"),
        JobSucceeded(occurred_at=at(4001), job_id="job-1", attempt=1, final_loss=9.0, checkpoint_dir=None),
    ]
    assert records(events + late) == records(events)


def test_a_placement_under_an_older_term_is_fenced() -> None:
    events = accepted("job-1", T0)
    newer = placed("job-1", at(10)).model_copy(update={"term": 5})
    preempted = JobPreempted(
        occurred_at=at(20), job_id="job-1", attempt=1, by_job="other", checkpoint_dir=None, checkpoint_step=None
    )
    stale = placed("job-1", at(30), attempt=2, model="V100").model_copy(update={"term": 4})
    [record] = records([*events, newer, preempted, stale]).values()
    assert (record.state, record.attempts, record.gpu_model) == (JobState.READY, 1, "A100")
    assert record.gpu_hours == pytest.approx(2 * 10 / 3600)  # the preempted attempt held 2 GPUs for 10 s


def test_rejections_and_pending_reasons_are_not_records() -> None:
    rejected = JobRejected(
        occurred_at=T0, job_id="bad", reason=RejectReason.MISSING_FIELD, message="no gpu", source_offset="t/0/1"
    )
    unschedulable = JobUnschedulable(occurred_at=at(1), job_id="job-1", reason=PendingReason.NO_FIT, message="full")
    book = AccountingBook()
    for event in [rejected, *accepted("job-1", T0)]:
        book.apply(event)
    first = book.take_changed()
    book.apply(unschedulable)
    assert [r.job_id for r in first] == ["job-1"] and book.take_changed() == []


def test_a_running_job_counts_the_attempts_that_ended_and_has_no_run_time_yet() -> None:
    [record] = records(STORIES["retried"]("job-1", T0)[:-1]).values()  # attempt 2 still running
    assert (record.state, record.attempts, record.ended_at, record.run_s) == (JobState.RUNNING, 2, None, None)
    assert record.gpu_hours == pytest.approx(1.0)  # attempt 1: 2 GPUs for 1800 s
    assert record.wait_s == 0.0 and record.final_loss is None


@pytest.mark.parametrize("loss", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_diverged_final_loss_is_none(loss: float) -> None:
    events = succeeded("job-1", T0)
    end = events[-1].model_copy(update={"final_loss": loss})
    [record] = records([*events[:-1], end]).values()
    assert record.state is JobState.SUCCEEDED and record.final_loss is None


def test_records_not_written_are_taken_again_with_their_newest_state() -> None:
    book = AccountingBook()
    events = succeeded("job-1", T0)
    for event in events[:3]:
        book.apply(event)  # type: ignore[arg-type]
    failed_write = book.take_changed()
    book.changed_again(failed_write)
    book.apply(events[3])  # type: ignore[arg-type]
    [again] = book.take_changed()
    assert again.state is JobState.RUNNING and again.revision == 4 and book.pending == 0


def test_the_json_of_a_record_is_plain_values() -> None:
    record = expected("succeeded", "job-1", T0)
    document = record.to_json()
    assert document["state"] == "SUCCEEDED" and document["submitted_at"] == T0.isoformat()
    assert document["started_at"] == (T0 + timedelta(seconds=10)).isoformat() and document["final_loss"] == 1.25


def test_an_unended_row_of_a_job_the_log_no_longer_holds_ends_broker_log_lost() -> None:
    book = AccountingBook()
    for event in accepted("kept", at(0)):
        book.apply(event)  # type: ignore[arg-type]
    row = JobRecord(job_id="lost", submitted_at=at(0), state=JobState.READY, gpus=1, gpu_model=None, attempts=0,
                    gpu_hours=0.0, revision=3)  # fmt: skip
    same_id_new_job = JobRecord(job_id="kept", submitted_at=at(-100), state=JobState.RUNNING, gpus=1, gpu_model=None,
                                attempts=1, gpu_hours=0.0, revision=5)  # fmt: skip
    known = book.take_changed()[0]
    newer = replace(row, job_id="newer", submitted_at=at(50))  # another replica may have read further
    ended = replace(row, job_id="done", state=JobState.SUCCEEDED)

    found = stranded([row, same_id_new_job, known, newer, ended], book, before=at(40), now=at(60))

    assert [(r.job_id, r.submitted_at) for r in found] == [("lost", at(0)), ("kept", at(-100))]
    assert {(r.state, r.reason, r.ended_at) for r in found} == {(JobState.FAILED, "BROKER_LOG_LOST", at(60))}
    assert found[0].revision == 4 and "while it was READY" in found[0].message


def test_a_record_names_who_submitted_and_the_key_that_signed() -> None:
    book = AccountingBook()
    accepted_signed, ready = accepted("signed", at(0), owner="alice")
    assert isinstance(accepted_signed, JobAccepted)
    key = UsedSignature(nonce="n1", expires_s=300.0, team="default", key_id="k2")
    book.apply(accepted_signed.model_copy(update={"signature": key}))
    book.apply(ready)  # type: ignore[arg-type]
    for event in accepted("unsigned", at(1)):
        book.apply(event)  # type: ignore[arg-type]
    records = {r.job_id: r for r in book.take_changed()}
    assert (records["signed"].owner, records["signed"].key_id) == ("alice", "k2")
    assert records["unsigned"].key_id is None


def test_a_jobs_ledger_is_written_once_it_ended_and_its_steps_cost_no_write_before() -> None:
    book = AccountingBook()
    events = STORIES["retried"]("job-1", T0)
    *before_end, end = events
    for event in before_end:
        if isinstance(event, ShardProgress):
            book.on_shard(event)
        else:
            book.apply(event)  # type: ignore[arg-type]
    [running] = book.take_changed()
    assert (running.ettr, running.productive_s) == (None, None)  # the monitor shows a running job's ledger
    book.on_shard(progress("job-1", occurred_at=at(2000), step=1200, attempt=2))
    assert book.take_changed() == []  # a step of a running job changes no record
    book.apply(end)  # type: ignore[arg-type]
    [ended] = book.take_changed()
    assert ended.ettr == pytest.approx(3520 / 3660, abs=1e-6) and ended.recomputed_s == 50.0


def test_a_step_read_after_its_jobs_end_changes_the_ledger_at_the_same_revision() -> None:
    """The two topics are read side by side: the end may come before the shard's last reports."""
    book = AccountingBook()
    shard = [e for e in STORIES["retried"]("job-1", T0) if isinstance(e, ShardProgress)]
    for event in STORIES["retried"]("job-1", T0):
        if not isinstance(event, ShardProgress):
            book.apply(event)  # type: ignore[arg-type]
    [early] = book.take_changed()
    for event in shard:
        book.on_shard(event)
    [late] = book.take_changed()
    assert late == expected("retried", "job-1", T0) and late.revision == early.revision
    assert early.productive_s != late.productive_s
    book.on_shard(shard[-1])  # read again: nothing changes
    assert book.take_changed() == []


def test_a_shard_event_of_an_unknown_job_or_kind_changes_nothing() -> None:
    book = AccountingBook()
    book.on_shard(progress("nobody", step=3))
    book.on_shard(started("nobody"))
    assert book.take_changed() == [] and book.jobs == {}


def test_shard_events_read_before_their_jobs_acceptance_count_once_it_comes() -> None:
    """On a start the follower may hand over the shard topic before the lifecycle topic."""
    events = STORIES["retried"]("job-1", T0)
    shard = [e for e in events if isinstance(e, ShardProgress)]
    assert records([*shard, *(e for e in events if e not in shard)]) == {"job-1": expected("retried", "job-1", T0)}
