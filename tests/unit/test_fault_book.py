from __future__ import annotations

import pytest

from shardyard.events import FailureCause, JobFailed, JobSucceeded, NodeLost, ShardCause
from shardyard.fault_manager.book import FaultBook
from tests.unit.builders import assignment, at, failed, scheduled


def lost(node_id: str, silent: float = 12.0) -> NodeLost:
    return NodeLost(occurred_at=at(silent), node_id=node_id, last_heartbeat_at=at(0), silent_for_s=silent)


def book_with(*facts: object) -> FaultBook:
    book = FaultBook()
    for fact in facts:
        book.apply(fact)
    return book


def test_shard_failure_fails_the_job_with_its_cause() -> None:
    book = book_with(scheduled("job-1", "node-a", "node-b"))
    failure = failed(shard_index=1, node_id="node-b", cause=FailureCause.USER_ERROR, exit_code=3, message="no dataset")

    (event,) = book.on_shard_failed(failure, at(5))

    assert isinstance(event, JobFailed)
    assert (event.job_id, event.attempt, event.cause, event.occurred_at) == ("job-1", 1, FailureCause.USER_ERROR, at(5))
    assert event.causes == (
        ShardCause(shard_index=1, node_id="node-b", cause=FailureCause.USER_ERROR, message="no dataset"),
    )
    assert "shard 1 on node-b" in event.message and "no dataset" in event.message


def test_redelivered_failure_is_a_no_op() -> None:
    book = book_with(scheduled())
    book.on_shard_failed(failed(), at(5))

    assert book.on_shard_failed(failed(), at(6)) == []


def test_second_shard_of_a_failed_gang_is_a_no_op() -> None:
    book = book_with(scheduled())
    book.on_shard_failed(failed(shard_index=0), at(5))

    assert book.on_shard_failed(failed(shard_index=1, cause=FailureCause.COMM_ERROR), at(6)) == []


@pytest.mark.parametrize(
    "facts",
    [
        pytest.param([scheduled(attempt=2)], id="scheduled-attempt-2"),
        pytest.param([assignment(attempt=2)], id="assignment-attempt-2"),
    ],
)
def test_failure_of_an_older_attempt_is_ignored(facts: list[object]) -> None:
    book = book_with(*facts)

    assert book.on_shard_failed(failed(attempt=1), at(5)) == []


def test_failure_of_a_job_that_already_succeeded_is_ignored() -> None:
    book = book_with(
        scheduled(), JobSucceeded(occurred_at=at(4), job_id="job-1", attempt=1, final_loss=1.0, checkpoint_dir=None)
    )

    assert book.on_shard_failed(failed(), at(5)) == []


def test_failure_before_the_gang_is_known_still_fails_the_job() -> None:
    book = FaultBook()

    (event,) = book.on_shard_failed(failed(job_id="job-9", attempt=1, cause=FailureCause.KILLED), at(5))

    assert isinstance(event, JobFailed)
    assert (event.job_id, event.cause) == ("job-9", FailureCause.KILLED)
    assert book.on_shard_failed(failed(job_id="job-9", shard_index=1), at(6)) == []


@pytest.mark.parametrize(
    "facts",
    [
        pytest.param(
            [
                scheduled("job-1", "node-a", "node-b"),
                scheduled("job-2", "node-b", "node-b"),
                scheduled("job-3", "node-c"),
            ],
            id="from-job-scheduled",
        ),
        pytest.param(
            [
                assignment("job-1", 0, "node-a"),
                assignment("job-1", 1, "node-b"),
                assignment("job-2", 0, "node-b"),
                assignment("job-2", 1, "node-b"),
                assignment("job-3", 0, "node-c"),
            ],
            id="from-assignments",
        ),
    ],
)
def test_node_lost_fails_exactly_the_jobs_with_shards_there(facts: list[object]) -> None:
    book = book_with(*facts)

    events = book.on_node_lost(lost("node-b"), at(12))

    assert all(isinstance(e, JobFailed) and e.cause is FailureCause.NODE_LOST for e in events)
    failures = {e.job_id: e for e in events if isinstance(e, JobFailed)}
    assert sorted(failures) == ["job-1", "job-2"]
    assert [(c.shard_index, c.node_id, c.cause) for c in failures["job-1"].causes] == [
        (1, "node-b", FailureCause.NODE_LOST)
    ]
    assert [c.shard_index for c in failures["job-2"].causes] == [0, 1]
    assert "12.0s" in failures["job-1"].message


def test_node_lost_twice_fails_nothing_more() -> None:
    book = book_with(scheduled("job-1", "node-b"))
    book.on_node_lost(lost("node-b"), at(12))

    assert book.on_node_lost(lost("node-b", 20.0), at(20)) == []
    assert book.on_shard_failed(failed(node_id="node-b"), at(21)) == []


def test_node_lost_after_the_job_ended_fails_nothing() -> None:
    book = book_with(
        scheduled("job-1", "node-b"),
        JobFailed(occurred_at=at(3), job_id="job-1", attempt=1, cause=FailureCause.KILLED, message="k"),
    )

    assert book.on_node_lost(lost("node-b"), at(12)) == []


def test_newer_attempt_replaces_the_old_gang() -> None:
    book = book_with(assignment(attempt=1, node_id="node-a"), assignment(attempt=2, node_id="node-b"))

    assert book.on_node_lost(lost("node-a"), at(12)) == []
    (event,) = book.on_node_lost(lost("node-b"), at(12))
    assert isinstance(event, JobFailed) and event.attempt == 2
