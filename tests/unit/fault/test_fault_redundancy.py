"""Adaptive redundancy: the spare ratio from the shard failure rate over a sliding window."""

from __future__ import annotations

import pytest

from shardyard.events import FailureCause, RedundancyChanged
from shardyard.fault_manager.redundancy import RedundancyPolicy, RedundancyTracker, target_ratio
from tests.unit.builders import at, failed, started

C = FailureCause


@pytest.mark.parametrize(
    ("failures", "attempts", "ratio"),
    [
        pytest.param(0, 0, 0.0, id="no-attempts"),
        pytest.param(0, 100, 0.0, id="no-failures"),
        pytest.param(1, 1000, 0.05, id="0.1pct-rounds-up-to-a-step"),
        pytest.param(5, 100, 0.10, id="5pct"),
        pytest.param(6, 100, 0.15, id="6pct-rounds-up"),
        pytest.param(15, 200, 0.15, id="7.5pct"),
        pytest.param(10, 100, 0.20, id="10pct"),
        pytest.param(20, 100, 0.40, id="20pct"),
        pytest.param(25, 100, 0.50, id="25pct-at-the-bound"),
        pytest.param(60, 100, 0.50, id="60pct-bounded"),
        pytest.param(100, 100, 0.50, id="all-bounded"),
    ],
)
def test_failure_rate_to_ratio(failures: int, attempts: int, ratio: float) -> None:
    assert target_ratio(failures, attempts, RedundancyPolicy()) == ratio


@pytest.mark.parametrize(
    ("policy", "failures", "attempts", "ratio"),
    [
        pytest.param(RedundancyPolicy(min_ratio=0.1), 0, 100, 0.1, id="floor"),
        pytest.param(RedundancyPolicy(max_ratio=0.2), 50, 100, 0.2, id="ceiling"),
        pytest.param(RedundancyPolicy(max_ratio=0.33), 50, 100, 0.33, id="ceiling-off-the-step"),
        pytest.param(RedundancyPolicy(step=0.1), 5, 100, 0.1, id="coarser-step"),
        pytest.param(RedundancyPolicy(step=0.1), 6, 100, 0.2, id="coarser-step-rounds-up"),
    ],
)
def test_ratio_bounds_and_step(policy: RedundancyPolicy, failures: int, attempts: int, ratio: float) -> None:
    assert target_ratio(failures, attempts, policy) == ratio


def run(tracker: RedundancyTracker, job: str, shards: int, t: float, *causes: FailureCause) -> None:
    """A gang attempt of ``shards`` shards starting at ``t``; ``causes`` fail its first shards one second later."""
    for i in range(shards):
        tracker.apply(started(job, i, occurred_at=at(t)))
    for i, cause in enumerate(causes):
        tracker.apply(failed(job, i, cause=cause, occurred_at=at(t + 1)))


def test_the_ratio_rises_with_failures_and_falls_as_they_leave_the_window() -> None:
    tracker = RedundancyTracker(RedundancyPolicy(window_s=600))
    for n in range(19):
        run(tracker, f"ok-{n}", 1, 0)
    run(tracker, "bad", 1, 0, C.KILLED)

    change = tracker.check(at(10))
    assert isinstance(change, RedundancyChanged)
    assert (change.ratio, change.previous_ratio) == (0.1, 0.0)
    assert (change.shard_attempts, change.shard_failures, change.failure_rate, change.window_s) == (20, 1, 0.05, 600)
    assert tracker.check(at(20)) is None, "unchanged step: nothing published"

    for n in range(20):
        run(tracker, f"ok-late-{n}", 1, 300)
    change = tracker.check(at(301))
    assert change is not None and (change.previous_ratio, change.ratio) == (0.1, 0.05), "1 in 40: 2.5 %"

    change = tracker.check(at(610))
    assert change is not None and (change.ratio, change.shard_attempts, change.shard_failures) == (0.0, 20, 0)
    assert tracker.check(at(905)) is None


def test_rising_then_falling_step_by_step() -> None:
    tracker = RedundancyTracker(RedundancyPolicy(window_s=100))
    seen: list[float] = []

    def check(t: float) -> None:
        change = tracker.check(at(t))
        if change is not None:
            assert change.previous_ratio == (seen[-1] if seen else 0.0)
            seen.append(change.ratio)

    for n in range(10):
        run(tracker, f"ok-{n}", 1, 0)
    check(1)
    run(tracker, "bad-1", 1, 10, C.KILLED)  # 1 / 11 = 9 % -> 0.20
    check(12)
    run(tracker, "bad-2", 1, 20, C.GPU_FAULT)  # 2 / 12 = 17 % -> 0.35
    check(22)
    run(tracker, "bad-3", 1, 30, C.OOM)  # 3 / 13 = 23 % -> 0.50 (bounded)
    check(32)
    run(tracker, "bad-4", 1, 40, C.NODE_LOST)  # 4 / 14 -> still 0.50
    check(42)
    check(105)  # the 10 good ones left: 4 / 4 -> 0.50
    check(112)  # bad-1 left: 3 / 3
    check(142)  # all left: no attempts -> 0
    assert seen == [0.2, 0.35, 0.5, 0.0]


@pytest.mark.parametrize(
    "cause", [C.USER_ERROR, C.MISSING_ARTIFACT, C.DEPENDENCY_FAILED, C.REVOKED], ids=lambda c: c.value
)
def test_user_errors_and_revocations_are_not_counted(cause: FailureCause) -> None:
    tracker = RedundancyTracker()
    run(tracker, "job", 1, 0, cause)

    assert tracker.check(at(2)) is None
    assert (tracker.window.attempts, tracker.window.failures) == (1, 0)


@pytest.mark.parametrize(
    ("causes", "failures"),
    [
        pytest.param([C.KILLED, C.COMM_ERROR, C.COMM_ERROR, C.COMM_ERROR], 1, id="peers-of-a-dead-shard-count-once"),
        pytest.param([C.COMM_ERROR, C.COMM_ERROR, C.COMM_ERROR, C.COMM_ERROR], 1, id="comm-only-counts-one"),
        pytest.param([C.NODE_LOST, C.NODE_LOST, C.COMM_ERROR], 2, id="two-shards-on-a-lost-node"),
        pytest.param([C.OOM], 1, id="one"),
    ],
)
def test_a_failed_gang_counts_its_culprits_not_the_peers_it_took_down(
    causes: list[FailureCause], failures: int
) -> None:
    tracker = RedundancyTracker()
    run(tracker, "job", 4, 0, *causes)
    tracker.window.prune(at(2))

    assert (tracker.window.attempts, tracker.window.failures) == (4, failures)


def test_redelivered_shard_events_count_once() -> None:
    tracker = RedundancyTracker()
    run(tracker, "job", 2, 0, C.KILLED)
    run(tracker, "job", 2, 0, C.KILLED)
    tracker.apply(failed("job", 0, cause=C.PROCESS_EXIT, occurred_at=at(3)))

    change = tracker.check(at(5))
    assert change is not None and (change.shard_attempts, change.shard_failures) == (2, 1)


def test_failures_without_a_start_are_attempts_too() -> None:
    tracker = RedundancyTracker()
    tracker.apply(failed("job", 0, cause=C.LAUNCH_ERROR, occurred_at=at(1)))

    change = tracker.check(at(2))
    assert change is not None and (change.shard_attempts, change.shard_failures, change.failure_rate) == (1, 1, 1.0)


def test_events_out_of_time_order_leave_the_window_by_their_own_time() -> None:
    tracker = RedundancyTracker(RedundancyPolicy(window_s=100))
    run(tracker, "late", 1, 90, C.KILLED)
    run(tracker, "early", 1, 0, C.KILLED)

    tracker.window.prune(at(150))
    assert (tracker.window.attempts, tracker.window.failures) == (1, 1)


def test_the_ratio_restored_from_the_topic_is_the_one_compared() -> None:
    tracker = RedundancyTracker()
    tracker.apply(
        RedundancyChanged(
            occurred_at=at(0),
            ratio=0.1,
            previous_ratio=0.0,
            failure_rate=0.05,
            window_s=600,
            shard_attempts=20,
            shard_failures=1,
        )
    )
    for n in range(19):
        run(tracker, f"ok-{n}", 1, 0)
    run(tracker, "bad", 1, 0, C.KILLED)

    assert tracker.check(at(5)) is None
    falls = tracker.check(at(700))
    assert falls is not None and (falls.previous_ratio, falls.ratio) == (0.1, 0.0)
