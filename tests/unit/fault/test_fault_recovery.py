"""The recovery rules as tables: every failure cause, the node it excludes, the backoff, the retry budget."""

from __future__ import annotations

from datetime import timedelta

import pytest

from shardyard.events import FailureCause, JobFailed, JobRecovering, ShardCause
from shardyard.fault_manager.recovery import (
    DISPOSITION,
    Disposition,
    FailedAttempt,
    RetryPolicy,
    is_due,
    outcome,
)
from tests.unit.builders import at

C = FailureCause


def cause(cause: FailureCause, shard_index: int = 0, node_id: str = "node-a", message: str = "boom") -> ShardCause:
    return ShardCause(shard_index=shard_index, node_id=node_id, cause=cause, message=message)


def attempt(
    *causes: ShardCause,
    retries_used: int = 0,
    bad: frozenset[str] = frozenset(),
    earlier_causes: tuple[ShardCause, ...] = (),
) -> FailedAttempt:
    return FailedAttempt(
        job_id="job-1",
        attempt=retries_used + 1,
        causes=causes,
        bad_nodes=bad,
        retries_used=retries_used,
        earlier_causes=earlier_causes,
    )


def test_every_cause_has_a_disposition() -> None:
    assert set(DISPOSITION) == set(FailureCause)


@pytest.mark.parametrize(
    ("failure", "decision", "excluded"),
    [
        pytest.param(C.PROCESS_EXIT, JobRecovering, (), id="process-exit-retried-node-kept"),
        pytest.param(C.KILLED, JobRecovering, (), id="killed-retried-node-kept"),
        pytest.param(C.COMM_ERROR, JobRecovering, (), id="comm-error-retried-reporter-kept"),
        pytest.param(C.SYNC_TIMEOUT, JobRecovering, (), id="sync-timeout-retried-reporter-kept"),
        pytest.param(C.OOM, JobRecovering, ("node-b",), id="oom-retried-node-excluded"),
        pytest.param(C.GPU_FAULT, JobRecovering, ("node-b",), id="gpu-fault-retried-node-excluded"),
        pytest.param(C.LAUNCH_ERROR, JobRecovering, ("node-b",), id="launch-error-retried-node-excluded"),
        pytest.param(C.NODE_LOST, JobRecovering, ("node-b",), id="node-lost-retried-node-excluded"),
        pytest.param(C.START_TIMEOUT, JobRecovering, ("node-b",), id="start-timeout-retried-node-excluded"),
        pytest.param(C.ORPHANED, JobRecovering, (), id="orphaned-retried-node-kept"),
        pytest.param(C.IO_ERROR, JobRecovering, ("node-b",), id="io-error-retried-node-excluded"),
        pytest.param(C.DISK_FULL, JobRecovering, (), id="disk-full-with-no-room-elsewhere-counted-node-kept"),
        pytest.param(C.USER_ERROR, JobFailed, None, id="user-error-fails"),
        pytest.param(C.MISSING_ARTIFACT, JobFailed, None, id="missing-artifact-fails"),
        pytest.param(C.DEPENDENCY_FAILED, JobFailed, None, id="dependency-failed-fails"),
        pytest.param(C.INVALID_SPEC, JobFailed, None, id="invalid-spec-fails"),
    ],
)
def test_cause_to_decision(failure: FailureCause, decision: type, excluded: tuple[str, ...] | None) -> None:
    event = outcome(attempt(cause(failure, 1, "node-b", "why")), RetryPolicy(), at(5))

    assert isinstance(event, decision)
    assert event.cause is failure and event.attempt == 1 and event.occurred_at == at(5)
    assert event.causes == (cause(failure, 1, "node-b", "why"),)
    assert "shard 1 on node-b" in event.message and "why" in event.message
    if isinstance(event, JobRecovering):
        assert event.exclude_nodes == excluded
        assert (event.retries_used, event.retries_left, event.retry_at) == (1, 2, at(5))


def test_revocations_are_not_faults() -> None:
    assert DISPOSITION[C.REVOKED] is Disposition.IGNORE


def test_suspect_or_lost_nodes_are_excluded_whatever_the_cause() -> None:
    event = outcome(attempt(cause(C.KILLED, 0, "node-a"), bad=frozenset({"node-c", "node-b"})), RetryPolicy(), at(1))

    assert isinstance(event, JobRecovering)
    assert event.exclude_nodes == ("node-b", "node-c")


def test_the_root_cause_is_the_first_that_is_not_a_peers_comm_error() -> None:
    causes = (cause(C.COMM_ERROR, 0, "node-a"), cause(C.GPU_FAULT, 1, "node-b"), cause(C.KILLED, 2, "node-c"))

    event = outcome(attempt(*causes), RetryPolicy(), at(1))

    assert isinstance(event, JobRecovering)
    assert event.cause is C.GPU_FAULT
    assert event.causes == causes
    assert event.exclude_nodes == ("node-b",)
    assert "(+2 more)" in event.message


def test_a_fatal_cause_wins_over_retryable_ones_and_lists_every_cause() -> None:
    earlier = (cause(C.KILLED, 0, "node-x"),)
    causes = (cause(C.COMM_ERROR, 0, "node-a"), cause(C.USER_ERROR, 1, "node-b", "bad script"))

    event = outcome(attempt(*causes, retries_used=1, earlier_causes=earlier), RetryPolicy(), at(1))

    assert isinstance(event, JobFailed)
    assert event.cause is C.USER_ERROR
    assert event.causes == earlier + causes
    assert "bad script" in event.message


@pytest.mark.parametrize(
    ("retry", "wait_s"),
    [
        pytest.param(1, 0, id="first-immediate"),
        pytest.param(2, 2, id="second-2s"),
        pytest.param(3, 4, id="third-4s"),
        pytest.param(4, 8, id="fourth-8s"),
        pytest.param(5, 16, id="fifth-16s"),
        pytest.param(6, 30, id="sixth-capped"),
        pytest.param(20, 30, id="far-capped"),
    ],
)
def test_backoff(retry: int, wait_s: float) -> None:
    assert RetryPolicy().backoff(retry) == timedelta(seconds=wait_s)


@pytest.mark.parametrize(
    ("retries_used", "retry_after_s", "left"),
    [
        pytest.param(0, 0, 2, id="first-retry"),
        pytest.param(1, 2, 1, id="second-retry"),
        pytest.param(2, 4, 0, id="third-retry"),
    ],
)
def test_each_recovery_counts_down_the_budget(retries_used: int, retry_after_s: float, left: int) -> None:
    event = outcome(attempt(cause(C.KILLED), retries_used=retries_used), RetryPolicy(), at(10))

    assert isinstance(event, JobRecovering)
    assert event.attempt == retries_used + 1
    assert (event.retries_used, event.retries_left) == (retries_used + 1, left)
    assert event.retry_at == at(10 + retry_after_s)


def test_a_spent_budget_ends_the_job_with_every_cause_of_every_attempt() -> None:
    earlier = (
        cause(C.KILLED, 0, "n1"),
        cause(C.OOM, 1, "n2"),
        cause(C.COMM_ERROR, 0, "n3"),
        cause(C.NODE_LOST, 1, "n4"),
    )
    last = (cause(C.GPU_FAULT, 0, "n5"),)

    event = outcome(attempt(*last, retries_used=3, earlier_causes=earlier), RetryPolicy(max_retries=3), at(9))

    assert isinstance(event, JobFailed)
    assert (event.attempt, event.cause) == (4, C.GPU_FAULT)
    assert event.causes == earlier + last
    assert "failed after 4 attempts" in event.message


def test_no_retries_at_all() -> None:
    event = outcome(attempt(cause(C.KILLED)), RetryPolicy(max_retries=0), at(9))

    assert isinstance(event, JobFailed)
    assert "failed after 1 attempt " in event.message


@pytest.mark.parametrize(
    ("silent", "now_s", "due"),
    [
        pytest.param(False, 3.5, True, id="every-shard-reported-comm-grace"),
        pytest.param(True, 3.5, False, id="a-silent-shard-waits-longer"),
        pytest.param(True, 9.9, False, id="within-the-silent-grace"),
        pytest.param(True, 10.0, True, id="after-the-silent-grace"),
    ],
)
def test_a_silent_shard_stretches_the_wait_for_the_culprit(silent: bool, now_s: float, due: bool) -> None:
    policy = RetryPolicy(comm_grace_s=3.5, silent_grace_s=10.0)

    assert is_due([cause(C.COMM_ERROR, 0)], frozenset(), at(0), policy, at(now_s), silent=silent) is due
    assert is_due([cause(C.KILLED, 0)], frozenset(), at(0), policy, at(0), silent=silent), "a culprit: at once"


@pytest.mark.parametrize(
    ("causes", "bad", "now_s", "due"),
    [
        pytest.param([C.COMM_ERROR], frozenset(), 3.0, False, id="comm-only-within-grace-waits"),
        pytest.param([C.COMM_ERROR, C.COMM_ERROR], frozenset(), 3.5, True, id="comm-only-after-grace"),
        pytest.param([C.COMM_ERROR], frozenset({"node-b"}), 0.1, True, id="comm-with-a-bad-node-at-once"),
        pytest.param([C.COMM_ERROR, C.KILLED], frozenset(), 0.1, True, id="comm-with-a-culprit-at-once"),
        pytest.param([C.KILLED], frozenset(), 0.0, True, id="non-comm-at-once"),
        pytest.param([C.SYNC_TIMEOUT], frozenset(), 0.0, True, id="sync-timeout-at-once"),
    ],
)
def test_comm_errors_wait_for_their_culprit(
    causes: list[FailureCause], bad: frozenset[str], now_s: float, due: bool
) -> None:
    shard_causes = [cause(c, i) for i, c in enumerate(causes)]

    assert is_due(shard_causes, bad, at(0), RetryPolicy(comm_grace_s=3.5), at(now_s)) is due
