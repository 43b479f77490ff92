from __future__ import annotations

from shardyard.events import (
    FailureCause,
    FieldError,
    JobAccepted,
    JobFailed,
    JobReady,
    JobRejected,
    JobRunning,
    JobSucceeded,
    JobUnschedulable,
    NodeStatus,
    PendingReason,
    RejectReason,
)
from shardyard.lifecycle import JobState
from shardyard.monitor.views import ClusterView
from tests.unit.builders import at, completed, job_spec, node_state, progress, scheduled, started

SPEC = job_spec(priority=5, max_steps=20)


def accepted(t: float = 0, job_id: str = "job-1") -> JobAccepted:
    return JobAccepted(occurred_at=at(t), job_id=job_id, spec=SPEC, source_offset=f"s/0/{t}")


def rejected(reason: RejectReason, t: float = 0, **overrides: object) -> JobRejected:
    fields: dict[str, object] = {"message": f"{reason} happened", "source_offset": f"s/0/{t}"}
    return JobRejected(occurred_at=at(t), job_id="job-1", reason=reason, **{**fields, **overrides})  # type: ignore[arg-type]


FULL_RUN: list[object] = [
    accepted(0),
    JobReady(occurred_at=at(0), job_id="job-1", spec=SPEC),
    scheduled("job-1", "node-a", "node-b", occurred_at=at(1)),
    started(shard_index=0, occurred_at=at(2)),
    started(shard_index=1, node_id="node-b", occurred_at=at(2)),
    JobRunning(occurred_at=at(2), job_id="job-1", attempt=1),
    progress(shard_index=0, step=5, loss=4.0, occurred_at=at(3)),
    progress(shard_index=1, node_id="node-b", step=5, loss=4.2, occurred_at=at(3)),
    progress(shard_index=0, step=10, loss=3.0, syncs=1, allreduce_ms=2.5, allreduce_bytes=4096, occurred_at=at(4)),
    progress(shard_index=1, node_id="node-b", step=10, loss=3.1, syncs=1, occurred_at=at(4)),
    progress(shard_index=0, step=20, loss=2.0, syncs=2, allreduce_ms=2.0, allreduce_bytes=4096, occurred_at=at(5)),
    completed(shard_index=0, final_loss=2.0, occurred_at=at(6)),
    completed(shard_index=1, node_id="node-b", final_loss=2.1, occurred_at=at(6)),
    JobSucceeded(
        occurred_at=at(7), job_id="job-1", attempt=1, final_loss=2.0, checkpoint_dir="/data/checkpoints/job-1"
    ),
]


def view_of(events: list[object]) -> ClusterView:
    view = ClusterView()
    for event in events:
        view.apply(event)
    return view


def test_full_run() -> None:
    job = view_of(FULL_RUN).jobs["job-1"]
    detail = job.detail()

    assert job.state is JobState.SUCCEEDED
    assert [entry["event"] for entry in job.timeline] == [
        "accepted",
        "ready",
        "scheduled",
        "shard started",
        "shard started",
        "running",
        "parameter sync",
        "parameter sync",
        "shard completed",
        "shard completed",
        "succeeded",
    ]
    assert [entry["at"] for entry in job.timeline] == sorted(entry["at"] for entry in job.timeline)
    assert job.loss == [(5, 4.0), (10, 3.0), (20, 2.0)]
    assert job.first_step_at == at(3)
    assert (job.submitted_at, job.ended_at, job.attempt) == (SPEC.submitted_at, at(7), 1)
    assert (detail["first_loss"], detail["final_loss"], detail["loss"]) == (4.0, 2.0, 2.0)
    assert detail["checkpoint_dir"] == "/data/checkpoints/job-1"
    assert [(p["shard_index"], p["node_id"]) for p in detail["placements"]] == [(0, "node-a"), (1, "node-b")]
    assert {k: v["state"] for k, v in detail["shards"].items()} == {"0": "COMPLETED", "1": "COMPLETED"}
    assert (detail["priority"], detail["gpus"], detail["max_steps"], detail["step"]) == (5, "2 x A100", 20, 10)
    assert "sync 2 at step 20" in job.timeline[7]["detail"]


def test_full_run_counts() -> None:
    view = view_of(FULL_RUN)

    assert view.counts()["SUCCEEDED"] == 1
    assert view.active_jobs() == 0
    assert [summary["state"] for summary in view.jobs_json()] == [JobState.SUCCEEDED]


def test_late_running_after_succeeded_keeps_the_state() -> None:
    view = view_of([*FULL_RUN, JobRunning(occurred_at=at(8), job_id="job-1", attempt=1)])
    job = view.jobs["job-1"]

    assert job.state is JobState.SUCCEEDED
    assert job.timeline[-1]["event"] == "succeeded"


def test_duplicate_rejection_of_a_running_job_is_a_note() -> None:
    view = view_of([*FULL_RUN[:6], rejected(RejectReason.DUPLICATE_JOB, 9)])
    job = view.jobs["job-1"]

    assert job.state is JobState.RUNNING
    assert (job.reason, job.ended_at, job.errors) == (None, None, [])
    assert job.timeline[-1]["event"] == "resubmission refused"
    assert "DUPLICATE_JOB" in job.timeline[-1]["detail"]


def test_rejected_job_shows_reason_and_errors() -> None:
    error = FieldError(field="resource_requirements.gpu.count", problem="greater_than_equal: >= 1", input="0")
    view = view_of([rejected(RejectReason.INVALID_VALUE, 1, errors=(error,))])
    job = view.jobs["job-1"]

    assert job.state is JobState.REJECTED
    assert (job.reason, job.message, job.ended_at) == (RejectReason.INVALID_VALUE, "INVALID_VALUE happened", at(1))
    assert job.errors == [error.model_dump()]
    assert job.detail()["errors"][0]["field"] == "resource_requirements.gpu.count"
    assert view.counts()["REJECTED"] == 1


def test_unschedulable_sets_a_pending_reason_that_scheduling_clears() -> None:
    pending = JobUnschedulable(
        occurred_at=at(1), job_id="job-1", reason=PendingReason.GPU_MODEL_MISMATCH, message="0/2 nodes"
    )
    view = view_of([*FULL_RUN[:2], pending])
    job = view.jobs["job-1"]
    assert (job.state, job.reason, job.message) == (JobState.READY, PendingReason.GPU_MODEL_MISMATCH, "0/2 nodes")

    view.apply(scheduled("job-1", occurred_at=at(2)))

    assert (job.state, job.reason, job.message) == (JobState.SCHEDULED, None, "")


def test_failed_job_shows_its_cause() -> None:
    failure = JobFailed(occurred_at=at(5), job_id="job-1", attempt=1, cause=FailureCause.NODE_LOST, message="lost")
    job = view_of([*FULL_RUN[:6], failure]).jobs["job-1"]

    assert (job.state, job.reason, job.message, job.ended_at) == (
        JobState.FAILED,
        FailureCause.NODE_LOST,
        "lost",
        at(5),
    )


def test_shard_events_of_an_older_attempt_are_ignored() -> None:
    requeued = JobReady(occurred_at=at(3), job_id="job-1", spec=SPEC)
    view = view_of([*FULL_RUN[:3], requeued, scheduled("job-1", attempt=2, occurred_at=at(4))])
    assert view.jobs["job-1"].attempt == 2

    view.apply(progress(step=7, attempt=1))

    assert (view.jobs["job-1"].shards, view.jobs["job-1"].loss) == ({}, [])


def test_resubmission_after_rejection_is_shown() -> None:
    view = view_of([rejected(RejectReason.MISSING_FIELD, 1)])

    view.apply(accepted(2))

    job = view.jobs["job-1"]
    assert (job.state, job.reason, job.errors) == (JobState.ACCEPTED, None, [])
    assert job.timeline[-1]["event"] == "accepted"


def test_nodes_json() -> None:
    view = view_of([node_state("node-b", status=NodeStatus.SUSPECT, allocated_gpus=(1,)), node_state("node-a")])

    nodes = view.nodes_json()

    assert [(n["node_id"], n["status"], n["allocated_gpus"]) for n in nodes] == [
        ("node-a", NodeStatus.ALIVE, []),
        ("node-b", NodeStatus.SUSPECT, [1]),
    ]
