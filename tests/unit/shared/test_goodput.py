"""The goodput ledger, pure: each story's parts, computed by hand from the definitions in ``shardyard.goodput.fold``;
the parts add up to the job's time; arrival order, redelivery, fenced placements and skewed clocks change nothing."""

import itertools
from collections.abc import Callable, Sequence

import pytest

from shardyard.events import (
    FailureCause,
    JobAccepted,
    JobCancelled,
    JobFailed,
    JobPreempted,
    JobPreempting,
    JobReady,
    JobRecovering,
    JobResized,
    JobRunning,
    JobScheduled,
    JobStraggling,
    JobSucceeded,
    ResizeReason,
    ShardCheckpointed,
    ShardFailed,
    ShardProgress,
    StragglerAction,
    StragglerKind,
)
from shardyard.goodput import PARTS, GoodputFold, Ledger, Part, ledger_of, ledger_of_events
from shardyard.lifecycle import LifecycleFact
from tests.unit.builders import at, failed, job_spec, progress, scheduled

ACCEPTED = JobAccepted(occurred_at=at(0), job_id="job-1", spec=job_spec(submitted_at=at(0)), source_offset="t/0/1")
READY = JobReady(occurred_at=at(0), job_id="job-1", spec=ACCEPTED.spec)


def placed(s: float, attempt: int = 1, *, term: int = 1, degraded: bool = False) -> JobScheduled:
    return scheduled(occurred_at=at(s), attempt=attempt, term=term, degraded=degraded)


def step(s: float, number: int, attempt: int = 1, shard: int = 0) -> ShardProgress:
    return progress(occurred_at=at(s), step=number, attempt=attempt, shard_index=shard)


def running(s: float, attempt: int = 1) -> JobRunning:
    return JobRunning(occurred_at=at(s), job_id="job-1", attempt=attempt)


def recovering(s: float, attempt: int = 1) -> JobRecovering:
    return JobRecovering(
        occurred_at=at(s),
        job_id="job-1",
        attempt=attempt,
        cause=FailureCause.NODE_LOST,
        message="lost",
        retry_at=at(s),
        retries_used=1,
        retries_left=2,
    )


def preempting(s: float, attempt: int = 1) -> JobPreempting:
    return JobPreempting(occurred_at=at(s), job_id="job-1", attempt=attempt, by_job="vip", deadline_s=30)


def preempted(s: float, attempt: int = 1, checkpoint_step: int | None = None) -> JobPreempted:
    return JobPreempted(
        occurred_at=at(s),
        job_id="job-1",
        attempt=attempt,
        by_job="vip",
        checkpoint_dir="/c",
        checkpoint_step=checkpoint_step,
    )


def succeeded(s: float, attempt: int = 1) -> JobSucceeded:
    return JobSucceeded(occurred_at=at(s), job_id="job-1", attempt=attempt, final_loss=1.0, checkpoint_dir=None)


def job_failed(s: float, attempt: int = 1) -> JobFailed:
    return JobFailed(occurred_at=at(s), job_id="job-1", attempt=attempt, cause=FailureCause.USER_ERROR, message="x")


def clean() -> list[object]:
    """Placed at 10, first step at 20, succeeds at 110."""
    return [ACCEPTED, READY, placed(10), running(12), *(step(s, s - 19) for s in range(20, 101, 10)), succeeded(110)]


def fault_and_recompute() -> list[object]:
    """Step 30 at 25, a shard killed at 27, recovering at 30; attempt 2 placed at 40 resumes from the checkpoint at
    step 20: its first step (22) at 50, step 26 at 60, 34 at 70 (so step 30 passed at 65), succeeds at 85."""
    return [
        ACCEPTED,
        READY,
        placed(0),
        running(2),
        step(5, 10),
        step(15, 20),
        ShardCheckpointed(
            occurred_at=at(16), job_id="job-1", shard_index=0, attempt=1, node_id="n", step=20, checkpoint_dir="/c"
        ),
        step(25, 30),
        failed(occurred_at=at(27), attempt=1, cause=FailureCause.KILLED),
        recovering(30),
        placed(40, 2),
        running(42, 2),
        step(50, 22, 2),
        step(60, 26, 2),
        step(70, 34, 2),
        step(80, 40, 2),
        succeeded(85, 2),
    ]


def preemption() -> list[object]:
    """Placed at 5, first step at 10; notice at 32, stopped at 36 after step 55; placed again at 50, resumes past
    step 55 (first step 57 at 58), succeeds at 75."""
    return [
        ACCEPTED,
        READY,
        placed(5),
        running(7),
        step(10, 1),
        step(30, 50),
        preempting(32),
        step(34, 55),
        preempted(36, checkpoint_step=55),
        placed(50, 2),
        running(52, 2),
        step(58, 57, 2),
        step(70, 80, 2),
        succeeded(75, 2),
    ]


def hang() -> list[object]:
    """Last step at 25; the node goes silent, no shard reports failing; recovering at 40; never placed again: the
    ledger is read at 60."""
    return [ACCEPTED, READY, placed(0), running(2), step(5, 10), step(25, 30), recovering(40)]


def degraded() -> list[object]:
    """On a degraded placement at 0, first step at 2, succeeds at 12."""
    return [ACCEPTED, READY, placed(0, degraded=True), running(1), step(2, 1), step(10, 50), succeeded(12)]


def no_steps() -> list[object]:
    """A user's command that reports no step: every shard started at 3, succeeds at 20."""
    return [ACCEPTED, READY, placed(0), running(3), succeeded(20)]


def user_error() -> list[object]:
    """Last step at 8, the job's own error ends it at 10."""
    return [ACCEPTED, READY, placed(0), running(1), step(2, 1), step(8, 7), job_failed(10)]


def cancelled_after_fault() -> list[object]:
    """Faulted at 20 (last step 15), cancelled at 50 while waiting to be placed again."""
    return [
        ACCEPTED,
        READY,
        placed(0),
        step(5, 1),
        step(15, 10),
        recovering(20),
        JobCancelled(occurred_at=at(50), job_id="job-1", message="by cli"),
    ]


def revoked_is_no_fault() -> list[object]:
    """A shard revoked (the scheduler stopped it on purpose) is no fault: the run stays productive."""
    return [
        ACCEPTED,
        READY,
        placed(0),
        step(4, 1),
        failed(occurred_at=at(6), cause=FailureCause.REVOKED),
        succeeded(10),
    ]


def resized() -> list[object]:
    """An elastic gang re-formed at another size: its shards stopped (a peer by COMM_ERROR as they went), and the
    next attempt, placed a second later, resumed from their live state. No fault, no recomputed step: the wait and
    its start are restart time."""
    grow = JobResized(
        occurred_at=at(21),
        job_id="job-1",
        attempt=1,
        from_shards=2,
        to_shards=4,
        reason=ResizeReason.GROW_INTO_IDLE,
    )
    return [
        ACCEPTED,
        READY,
        placed(0),
        step(4, 1),
        step(20, 16),
        grow,
        failed(occurred_at=at(21.2), shard_index=1, cause=FailureCause.COMM_ERROR),
        placed(22, attempt=2),
        step(24, 17, attempt=2),
        step(30, 22, attempt=2),
        succeeded(30, attempt=2),
    ]


def straggler(action: StragglerAction = StragglerAction.SWAP) -> list[object]:
    """Placed at 0, first step at 4; from 20 one rank runs at half speed (found at 50: since 20, ratio 2). Swapped
    (``action`` SWAP): the attempt is recovered at 50 without it, the next one placed at 52, stepping from 55, ends at
    70. Not swapped: the attempt goes on, slowed, to its end at 70."""
    found = JobStraggling(
        occurred_at=at(50),
        job_id="job-1",
        attempt=1,
        kind=StragglerKind.SLOW_NODE,
        action=action,
        shard_index=1,
        node_id="node-a",
        ratio=2.0,
        since=at(20),
    )
    begin = [ACCEPTED, READY, placed(0), step(4, 1), step(20, 17), found, step(49, 31)]
    if action is not StragglerAction.SWAP:
        return [*begin, step(69, 41), succeeded(70)]
    swap = recovering(50).model_copy(update={"cause": FailureCause.STRAGGLER, "counted": False, "retries_used": 0})
    return [*begin, swap, placed(52, attempt=2), step(55, 32, attempt=2), step(69, 46, attempt=2), succeeded(70, 2)]


Story = tuple[Callable[[], list[object]], float, dict[Part, float]]
STORIES: dict[str, Story] = {
    # story: (events, now (for an unended job), the parts by hand)
    "clean": (clean, 200, {Part.QUEUED: 10, Part.RECOVERY: 10, Part.PRODUCTIVE: 90}),
    "fault and recompute": (
        fault_and_recompute,
        200,
        # attempt 1: recovery 0-5, productive 5-25 (its last step reported: the killed shard's steps after it, if
        # any, are not known), recovery 25-30; the wait 30-40 is recovery; attempt 2: recovery 40-50, recomputed
        # 50-65, productive 65-85.
        {Part.RECOVERY: 5 + 5 + 10 + 10, Part.PRODUCTIVE: 20 + 20, Part.RECOMPUTED: 15},
    ),
    "preemption": (
        preemption,
        200,
        {Part.QUEUED: 5 + 14, Part.RECOVERY: 5 + 8, Part.PRODUCTIVE: 22 + 17, Part.NOTICE: 4},
    ),
    "hang": (hang, 60, {Part.RECOVERY: 5 + 15 + 20, Part.PRODUCTIVE: 20}),
    "degraded": (degraded, 200, {Part.RECOVERY: 2, Part.DEGRADED: 10}),
    "no steps": (no_steps, 200, {Part.RECOVERY: 3, Part.PRODUCTIVE: 17}),
    "user error": (user_error, 200, {Part.RECOVERY: 2 + 2, Part.PRODUCTIVE: 6}),
    "cancelled after a fault": (cancelled_after_fault, 200, {Part.RECOVERY: 5 + 5 + 30, Part.PRODUCTIVE: 10}),
    "revoked is no fault": (revoked_is_no_fault, 200, {Part.RECOVERY: 4, Part.PRODUCTIVE: 6}),
    "resized": (resized, 200, {Part.RECOVERY: 4 + 1 + 2, Part.PRODUCTIVE: 17 + 6}),
    # attempt 1: recovery 0-4, productive 4-20, then 20-49 (after the last step the swap's tail is recovery) at half
    # pace: 14.5 productive, 14.5 straggler; recovery 49-50 and the wait 50-52; attempt 2: recovery 52-55, productive
    # 55-70 (its steps pass the highest step at once: no recomputed work).
    "straggler swapped": (
        straggler,
        200,
        {Part.RECOVERY: 4 + 1 + 2 + 3, Part.PRODUCTIVE: 16 + 14.5 + 15, Part.STRAGGLER: 14.5},
    ),
    # not swapped: 20-70 at half pace: 25 productive, 25 straggler.
    "straggler not swapped": (
        lambda: straggler(StragglerAction.NO_BETTER_PLACE),
        200,
        {Part.RECOVERY: 4, Part.PRODUCTIVE: 16 + 25, Part.STRAGGLER: 25},
    ),
    "queued, not ended": (lambda: [ACCEPTED, READY], 42, {Part.QUEUED: 42}),
    "running, not ended": (
        lambda: [ACCEPTED, READY, placed(3), step(5, 1), step(9, 9)],
        20,
        {
            Part.QUEUED: 3,
            Part.RECOVERY: 2,
            Part.PRODUCTIVE: 15,
        },
    ),
}


def ledger(events: Sequence[object], now: float) -> Ledger:
    return ledger_of_events(ACCEPTED, events, at(now))


def parts(result: Ledger) -> dict[Part, float]:
    return {part: result.seconds(part) for part in PARTS if result.seconds(part)}


@pytest.mark.parametrize("story", STORIES, ids=str)
def test_each_story_gives_its_parts(story: str) -> None:
    events, now, expected = STORIES[story]
    assert parts(ledger(events(), now)) == pytest.approx(expected, abs=1e-9)
    assert set(parts(ledger(events(), now))) == set(expected)


@pytest.mark.parametrize("story", STORIES, ids=str)
def test_the_parts_add_up_to_the_jobs_time(story: str) -> None:
    events, now, _ = STORIES[story]
    fold = fold_of(events())
    end = fold.ended_at or at(now)
    assert ledger(events(), now).total_s == pytest.approx((end - at(0)).total_seconds(), abs=1e-9)


def fold_of(events: Sequence[object]) -> GoodputFold:
    fold = GoodputFold.of(ACCEPTED)
    for event in events:
        if isinstance(event, ShardProgress | ShardFailed):
            fold.on_shard(event)
        elif isinstance(event, LifecycleFact) and not isinstance(event, JobAccepted):
            fold.apply(event)
    return fold


def test_ettr_is_productive_time_over_the_whole() -> None:
    assert ledger(fault_and_recompute(), 200).ettr == pytest.approx(40 / 85)
    assert ledger(clean(), 200).ettr == pytest.approx(90 / 110)
    assert ledger(degraded(), 200).ettr == 0.0  # degraded time is its own part
    assert ledger([ACCEPTED], 0).ettr is None  # no time yet: no ratio


def test_a_preempted_job_shows_its_notice_and_no_recomputed_work() -> None:
    result = ledger(preemption(), 200)
    assert (result.notice_s, result.recomputed_s) == (4.0, 0.0)


@pytest.mark.parametrize("story", ["fault and recompute", "preemption", "clean"], ids=str)
def test_the_order_the_two_topics_arrive_in_changes_nothing(story: str) -> None:
    events, now, _ = STORIES[story]
    all_events = events()
    shard = [e for e in all_events if isinstance(e, ShardProgress | ShardFailed | ShardCheckpointed)]
    lifecycle = [e for e in all_events if e not in shard]
    expected = ledger(all_events, now)
    assert ledger(shard + lifecycle, now) == expected  # every shard event first
    assert ledger(lifecycle + shard, now) == expected  # every lifecycle fact first
    assert ledger(all_events + all_events, now) == expected  # everything delivered twice


def test_a_late_or_fenced_fact_changes_nothing() -> None:
    late = [running(500), succeeded(600), recovering(700), preempting(800), placed(900, 3)]
    assert ledger(clean() + late, 1000) == ledger(clean(), 1000)
    fenced = [ACCEPTED, READY, placed(10, term=5), step(12, 1), placed(20, 2, term=4), step(30, 5)]
    assert parts(ledger(fenced, 40)) == {Part.QUEUED: 10, Part.RECOVERY: 2, Part.PRODUCTIVE: 28}


def test_a_shards_clock_is_clamped_into_its_attempt() -> None:
    behind = [ACCEPTED, READY, placed(10), step(8, 1), step(20, 10), succeeded(30)]  # its agent's clock 2 s behind
    assert parts(ledger(behind, 100)) == {Part.QUEUED: 10, Part.PRODUCTIVE: 20}
    ahead = [ACCEPTED, READY, placed(10), step(12, 1), step(35, 10), succeeded(30)]  # a report after the end
    assert parts(ledger(ahead, 100)) == {Part.QUEUED: 10, Part.RECOVERY: 2, Part.PRODUCTIVE: 18}


def test_the_gang_steps_once_its_last_shard_does() -> None:
    events = [ACCEPTED, READY, placed(0), step(6, 2, shard=1), step(4, 1, shard=0), succeeded(10)]
    assert parts(ledger(events, 100)) == {Part.RECOVERY: 6, Part.PRODUCTIVE: 4}


def test_a_gang_catches_up_when_its_last_shard_passes_the_earlier_high() -> None:
    """Local SGD: re-formed, rank 0 starts at 16 and redoes its steps alone up to the first sync, where it waits for
    rank 1, which starts at 18; the gang passed step 130 (attempt 1's high) when rank 1 did, at 19."""
    events = [
        *(ACCEPTED, READY, placed(0), step(5, 100), step(5, 100, shard=1), step(10, 130), recovering(12)),
        *(placed(14, 2), step(16, 120, 2), step(18, 120, 2, shard=1), step(20, 140, 2, shard=1), step(20, 140, 2)),
        succeeded(25, 2),
    ]
    assert parts(ledger(events, 100)) == {Part.RECOVERY: 5 + 2 + 2 + 4, Part.PRODUCTIVE: 5 + 6, Part.RECOMPUTED: 1}


def test_a_running_jobs_ledger_grows_with_now_and_a_fault_takes_back_the_stall() -> None:
    events = [ACCEPTED, READY, placed(0), step(5, 1), step(10, 5)]
    assert parts(ledger(events, 30)) == {Part.RECOVERY: 5, Part.PRODUCTIVE: 25}
    assert parts(ledger([*events, recovering(30)], 30)) == {Part.RECOVERY: 25, Part.PRODUCTIVE: 5}


def test_a_failing_shard_starts_the_fault_at_the_last_step_before_the_plan_comes() -> None:
    events = [ACCEPTED, READY, placed(0), step(5, 1), step(10, 5), failed(occurred_at=at(12))]
    assert parts(ledger(events, 30)) == {Part.RECOVERY: 5 + 20, Part.PRODUCTIVE: 5}


def test_a_survivor_blocked_on_a_dead_peer_trains_no_more_after_its_last_step() -> None:
    """A survivor's sync waits for its timeout on a dead peer before it fails: the wait is recovery. Its last step,
    reported on the failure but dated when the step ended, may come after the failure's report."""
    events = [ACCEPTED, READY, placed(0), step(5, 1), step(10, 5), failed(occurred_at=at(40)), step(11, 6)]
    assert parts(ledger(events, 50)) == {Part.RECOVERY: 5 + 39, Part.PRODUCTIVE: 6}


def test_a_fault_without_a_step_reported_starts_at_the_first_failure() -> None:
    events = [ACCEPTED, READY, placed(0), running(3), failed(occurred_at=at(12))]
    assert parts(ledger(events, 30)) == {Part.RECOVERY: 3 + 18, Part.PRODUCTIVE: 9}


def test_only_the_first_shard_failure_counts() -> None:
    fold = fold_of([ACCEPTED, READY, placed(0), step(5, 1), failed(occurred_at=at(12))])
    assert not fold.on_shard(failed(occurred_at=at(14), shard_index=1))
    assert fold.on_shard(failed(occurred_at=at(11), shard_index=1))  # a clock behind: the earlier one
    assert fold.attempts[1].failed_at == at(11)


def test_recomputation_ends_where_the_steps_pass_every_earlier_attempts_high() -> None:
    """Two faults: attempt 3 must pass the highest step of attempts 1 and 2 (step 40 of attempt 1)."""
    events = [
        ACCEPTED,
        READY,
        placed(0),
        step(1, 1),
        step(11, 40),
        recovering(12),
        placed(12, 2),
        step(13, 21, 2),
        step(23, 31, 2),
        recovering(24, 2),
        placed(24, 3),
        step(26, 30, 3),
        step(36, 50, 3),  # step 40 passed at 31
        succeeded(40, 3),
    ]
    # attempt 1: recovery 0-1, productive 1-11, recovery 11-12; attempt 2: recovery 12-13, recomputed 13-23 (never
    # caught up), recovery 23-24; attempt 3: recovery 24-26, recomputed 26-31, productive 31-40.
    assert parts(ledger(events, 100)) == pytest.approx(
        {Part.RECOVERY: 1 + 1 + 1 + 1 + 2, Part.PRODUCTIVE: 10 + 9, Part.RECOMPUTED: 10 + 5}
    )


def test_the_ledgers_json_holds_every_part_the_total_and_ettr() -> None:
    result = ledger_of({Part.QUEUED: 1.0, Part.PRODUCTIVE: 3.0})
    assert result.to_json() == {
        "queued_s": 1.0,
        "productive_s": 3.0,
        "recovery_s": 0.0,
        "recomputed_s": 0.0,
        "notice_s": 0.0,
        "degraded_s": 0.0,
        "straggler_s": 0.0,
        "total_s": 4.0,
        "ettr": 0.75,
    }


@pytest.mark.parametrize("cut", range(1, 13), ids=lambda cut: f"after-{cut}")
def test_a_ledger_read_midway_adds_up_to_now(cut: int) -> None:
    events = fault_and_recompute()[:cut]
    for now in (0, 17.5, 45):
        assert ledger(events, now).total_s == pytest.approx(now, abs=1e-9)


def test_marks_cost_nothing_per_report() -> None:
    fold = fold_of([ACCEPTED, READY, placed(0)])
    for n, s in zip(range(1, 10_001), itertools.count(1.0, 0.5), strict=False):
        fold.on_shard(step(s, n))
    assert len(fold.attempts) == 1 and fold.attempts[1].last_step == (at(5000.5), 10_000)


def test_shard_events_read_before_the_acceptance_still_count() -> None:
    """A follower reads both topics from their beginning, side by side: a job's shard events may come first."""
    events = fault_and_recompute()
    shard = [e for e in events if isinstance(e, ShardProgress | ShardFailed)]
    fold = GoodputFold()
    for report in shard:
        fold.on_shard(report)
    assert fold.ledger(at(200)) == Ledger()  # nothing to measure from before the acceptance
    for event in events:
        if isinstance(event, LifecycleFact):
            fold.apply(event)
    assert fold.ledger(at(200)) == ledger(events, 200)
    assert not fold.apply(ACCEPTED)  # the acceptance again


def test_the_segments_cut_the_jobs_time_in_order_one_per_stretch_of_a_part() -> None:
    fold = fold_of(fault_and_recompute())
    assert [
        (s.part, (s.start - at(0)).total_seconds(), (s.end - at(0)).total_seconds()) for s in fold.segments(at(200))
    ] == [
        (Part.RECOVERY, 0, 5),
        (Part.PRODUCTIVE, 5, 25),
        (Part.RECOVERY, 25, 50),  # the stall, the wait after the fault and the restart: one stretch
        (Part.RECOMPUTED, 50, 65),
        (Part.PRODUCTIVE, 65, 85),
    ]
    assert GoodputFold().segments(at(1)) == []
