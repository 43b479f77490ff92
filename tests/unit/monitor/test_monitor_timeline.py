"""A job's timeline in the order things happened, whatever order their events arrived in and whichever host's clock
stamped them; and one final loss wherever a finished job shows its loss."""

from __future__ import annotations

import pytest

from shardyard.events import FailureCause, JobAccepted, JobReady, JobRecovering, JobRunning, JobSucceeded
from shardyard.monitor.timeline import Timeline
from shardyard.monitor.views import ClusterView
from tests.unit.builders import at, completed, job_spec, progress, scheduled, started

SPEC = job_spec(priority=5, max_steps=20)
ACCEPTED = JobAccepted(occurred_at=at(0), job_id="job-1", spec=SPEC, source_offset="s/0/0")
READY = JobReady(occurred_at=at(0), job_id="job-1", spec=SPEC)


def events_of(view: ClusterView) -> list[str]:
    return [entry["event"] for entry in view.jobs["job-1"].timeline]


def view_of(events: list[object]) -> ClusterView:
    view = ClusterView()
    for event in events:
        view.apply(event)
    return view


@pytest.mark.parametrize(
    "events",
    [
        pytest.param(
            [ACCEPTED, READY, started(occurred_at=at(2)), scheduled("job-1", "node-a", occurred_at=at(1))],
            id="the-shard-event-arrives-before-the-placement",
        ),
        pytest.param(
            [ACCEPTED, READY, started(occurred_at=at(1)), scheduled("job-1", "node-a", occurred_at=at(1))],
            id="same-instant-arriving-backwards",
        ),
        pytest.param(
            [ACCEPTED, READY, scheduled("job-1", "node-a", occurred_at=at(1)), started(occurred_at=at(1))],
            id="same-instant-arriving-in-order",
        ),
        pytest.param(
            [ACCEPTED, READY, scheduled("job-1", "node-a", occurred_at=at(1)), started(occurred_at=at(0.9))],
            id="the-agents-clock-is-behind-the-schedulers",
        ),
        pytest.param(
            [ACCEPTED, READY, started(occurred_at=at(0.9)), scheduled("job-1", "node-a", occurred_at=at(1))],
            id="behind-and-arriving-first",
        ),
    ],
)
def test_scheduled_comes_before_shard_started(events: list[object]) -> None:
    assert events_of(view_of(events)) == ["accepted", "ready", "scheduled", "shard started"]


def test_each_note_keeps_the_time_its_event_says() -> None:
    view = view_of([ACCEPTED, READY, started(occurred_at=at(0.9)), scheduled("job-1", "node-a", occurred_at=at(1))])

    assert [entry["at"] for entry in view.jobs["job-1"].timeline][-2:] == [at(1).isoformat(), at(0.9).isoformat()]


def test_events_of_equal_time_go_in_lifecycle_order_and_attempts_in_turn() -> None:
    same = at(5)
    recovering = JobRecovering(
        occurred_at=same,
        job_id="job-1",
        attempt=1,
        cause=FailureCause.NODE_LOST,
        message="node-a lost",
        retry_at=same,
        retries_used=1,
        retries_left=2,
    )
    # The lifecycle topic delivers in order; the shards' topic, read by another consumer, early or late.
    arrived: list[object] = [
        ACCEPTED,
        READY,
        scheduled("job-1", "node-a", occurred_at=at(1)),
        JobRunning(occurred_at=at(1), job_id="job-1", attempt=1),
        started(occurred_at=at(1)),
        started(attempt=2, occurred_at=same),
        recovering,
        scheduled("job-1", "node-a", attempt=2, occurred_at=same),
    ]

    assert events_of(view_of(arrived)) == [
        "accepted",
        "ready",
        "scheduled",
        "shard started",
        "running",
        "recovering",
        "scheduled",
        "shard started",
    ]


def test_the_timeline_holds_at_most_its_limit() -> None:
    timeline = Timeline(limit=3)
    for second in range(5):
        timeline.note(at(second), "parameter sync", f"sync {second}", attempt=1)

    assert [entry["detail"] for entry in timeline] == ["sync 0", "sync 1", "sync 2"]
    assert timeline[-1] == timeline.entries()[-1] and len(timeline[0:2]) == 2


RUN: list[object] = [
    ACCEPTED,
    READY,
    scheduled("job-1", "node-a", "node-b", occurred_at=at(1)),
    started(shard_index=0, occurred_at=at(2)),
    started(shard_index=1, node_id="node-b", occurred_at=at(2)),
    JobRunning(occurred_at=at(2), job_id="job-1", attempt=1),
    progress(shard_index=0, step=10, loss=3.0, syncs=1, occurred_at=at(3)),
    progress(shard_index=1, node_id="node-b", step=10, loss=3.1, syncs=1, occurred_at=at(3)),
    # The last report's loss is the mean over the steps since the one before; the final loss is the last step's.
    progress(shard_index=0, step=20, loss=2.2, syncs=2, occurred_at=at(4)),
    progress(shard_index=1, node_id="node-b", step=20, loss=2.3, syncs=2, occurred_at=at(4)),
]
FINAL = 2.0
END: list[object] = [
    completed(shard_index=0, final_loss=FINAL, steps=20, occurred_at=at(5)),
    completed(shard_index=1, node_id="node-b", final_loss=2.05, steps=20, occurred_at=at(5)),
    JobSucceeded(occurred_at=at(6), job_id="job-1", attempt=1, final_loss=FINAL, checkpoint_dir="/data/out"),
]


def test_a_running_job_shows_rank_0s_last_report() -> None:
    detail = view_of(RUN).jobs["job-1"].detail()

    assert (detail["loss"], detail["final_loss"], detail["loss_curve"][-1]) == (2.2, None, (20, 2.2))


def test_a_finished_job_shows_one_final_loss_everywhere() -> None:
    view = view_of([*RUN, *END])
    job = view.jobs["job-1"]
    detail = job.detail()
    series = job.series_json()

    assert detail["final_loss"] == FINAL
    assert detail["loss"] == FINAL  # the progress bar, `jobs`, `top` and the dashboard's "loss first -> last"
    assert view.jobs_json()[0]["loss"] == FINAL
    assert detail["loss_curve"][-1] == (20, FINAL)  # the demo's loss curve
    assert (series["step"][-1], series["loss"][-1]) == (20, FINAL)  # the dashboard's chart and its last label
    assert detail["shards"]["0"]["loss"] == FINAL  # rank 0's row; rank 1's shows its own
    assert (detail["shards"]["1"]["loss"], detail["step"]) == (2.05, 20)
    assert [p[0] for p in detail["loss_curve"]] == [10, 20]
    assert job.timeline[-1]["detail"] == "final loss 2; checkpoint /data/out"
