from __future__ import annotations

import json
from datetime import datetime

import pytest

from shardyard.events import (
    FailureCause,
    FieldError,
    GpuStatus,
    JobAccepted,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobPreempted,
    JobPreempting,
    JobReady,
    JobRecovering,
    JobRejected,
    JobResized,
    JobRunning,
    JobSucceeded,
    JobUnschedulable,
    JobWaiting,
    MissingArtifact,
    NodeDrain,
    NodeStatus,
    PendingReason,
    RedundancyChanged,
    RejectReason,
    ResizeReason,
    ShardCheckpointed,
    ShardPlacement,
)
from shardyard.lifecycle import JobState
from shardyard.monitor.views import ClusterView
from tests.unit.builders import (
    GIB,
    at,
    completed,
    failed,
    heartbeat,
    job_spec,
    node_state,
    progress,
    scheduled,
    started,
)

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
    completed(shard_index=0, final_loss=2.0, steps=20, occurred_at=at(6)),
    completed(shard_index=1, node_id="node-b", final_loss=2.1, steps=20, occurred_at=at(6)),
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
    assert (detail["priority"], detail["gpus"], detail["max_steps"], detail["step"]) == (5, "2 x A100", 20, 20)
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


def test_a_shard_failed_at_its_start_deadline_shows_the_cause() -> None:
    timeout = failed(
        shard_index=1,
        node_id="node-b",
        cause=FailureCause.START_TIMEOUT,
        exit_code=None,
        message="not reported started within 60s of its assignment (attempt 1): revoked",
        occurred_at=at(61),
    )
    job = view_of([*FULL_RUN[:4], timeout]).jobs["job-1"]

    shard = job.detail()["shards"]["1"]
    assert (shard["state"], shard["cause"], shard["node_id"]) == ("FAILED", FailureCause.START_TIMEOUT, "node-b")
    assert job.timeline[-1]["event"] == "shard failed" and "START_TIMEOUT" in job.timeline[-1]["detail"]


def test_shard_events_of_an_older_attempt_are_ignored() -> None:
    requeued = JobPreempted(
        occurred_at=at(3), job_id="job-1", attempt=1, by_job="other", checkpoint_dir=None, checkpoint_step=None
    )
    view = view_of([*FULL_RUN[:3], requeued, scheduled("job-1", attempt=2, occurred_at=at(4))])
    assert view.jobs["job-1"].attempt == 2

    view.apply(progress(step=7, attempt=1))

    assert (view.jobs["job-1"].shards, view.jobs["job-1"].loss) == ({}, [])


def test_a_new_attempt_shows_its_own_shards_only() -> None:
    """A gang re-formed smaller (an elastic job's shrink): the earlier attempt's rows, and their steps, go."""
    resized = JobResized(
        occurred_at=at(5),
        job_id="job-1",
        attempt=1,
        from_shards=2,
        to_shards=1,
        reason=ResizeReason.SHRINK_FOR_PREEMPTION,
        by_job="vip",
    )
    view = view_of([*FULL_RUN[:10], resized, scheduled("job-1", "node-a", attempt=2, occurred_at=at(5))])
    job = view.jobs["job-1"]
    assert (job.shards, job.summary()["step"], job.resizes) == ({}, 0, 1)

    view.apply(started(shard_index=0, attempt=2, occurred_at=at(6)))

    assert list(job.shards) == [0] and (job.shards[0]["attempt"], job.shards[0]["step"]) == (2, 0)
    assert "resized 2 -> 1" in [entry["event"] for entry in job.timeline.entries()]


def test_resubmission_after_rejection_is_shown() -> None:
    view = view_of([rejected(RejectReason.MISSING_FIELD, 1)])

    view.apply(accepted(2))

    job = view.jobs["job-1"]
    assert (job.state, job.reason, job.errors) == (JobState.ACCEPTED, None, [])
    assert job.timeline[-1]["event"] == "accepted"


def test_nodes_json() -> None:
    view = view_of([node_state("node-b", status=NodeStatus.SUSPECT, allocated_gpus=(1,)), node_state("node-a")])

    nodes = json.loads(view.nodes_body())["nodes"]

    assert [(n["node_id"], n["status"], n["allocated_gpus"]) for n in nodes] == [
        ("node-a", NodeStatus.ALIVE, []),
        ("node-b", NodeStatus.SUSPECT, [1]),
    ]


@pytest.mark.parametrize(
    ("pool_received", "agent_sent", "shown"),
    [
        pytest.param(at(2), at(1), at(2), id="the-pools-receipt"),
        pytest.param(at(2), at(3), at(3), id="a-heartbeat-the-pool-has-not-answered-yet"),
    ],
)
def test_a_node_shows_its_newest_sign_of_life(pool_received: datetime, agent_sent: datetime, shown: datetime) -> None:
    view = view_of([node_state("n1", last_heartbeat_at=pool_received), heartbeat("n1", occurred_at=agent_sent)])

    (node,) = json.loads(view.nodes_body())["nodes"]

    assert datetime.fromisoformat(node["last_heartbeat_at"]) == shown


# --- waiting, degraded placement, preemption, cancellation, drain -------------------------------------------------
def waiting(reason: PendingReason, *parents: str, t: float = 1) -> JobWaiting:
    return JobWaiting(
        occurred_at=at(t), job_id="job-1", reason=reason, message=f"{reason} on {parents}", waiting_for=parents
    )


def test_waiting_sets_the_reason_and_what_the_job_waits_for() -> None:
    job = view_of([accepted(0), waiting(PendingReason.WAITING_FOR_DEPENDENCY, "a", "b")]).jobs["job-1"]

    detail = job.detail()
    assert (job.state, detail["reason"], detail["waiting_for"]) == (
        JobState.WAITING,
        PendingReason.WAITING_FOR_DEPENDENCY,
        ["a", "b"],
    )
    assert detail["message"] == "WAITING_FOR_DEPENDENCY on ('a', 'b')"
    assert job.timeline[-1]["event"] == "waiting"


@pytest.mark.parametrize(
    ("updates", "reason", "waiting_for", "notes"),
    [
        pytest.param(
            [waiting(PendingReason.WAITING_FOR_DEPENDENCY, "b", t=2)],
            PendingReason.WAITING_FOR_DEPENDENCY,
            ["b"],
            2,
            id="one-parent-left",
        ),
        pytest.param(
            [waiting(PendingReason.DEPENDENCY_FAILED, "a", t=2)],
            PendingReason.DEPENDENCY_FAILED,
            ["a"],
            2,
            id="held-after-failure",
        ),
        pytest.param(
            [waiting(PendingReason.WAITING_FOR_DEPENDENCY, "a", "b", t=2)],
            PendingReason.WAITING_FOR_DEPENDENCY,
            ["a", "b"],
            1,
            id="same-reason-noted-once",
        ),
    ],
)
def test_a_waiting_job_takes_a_new_reason(
    updates: list[JobWaiting], reason: PendingReason, waiting_for: list[str], notes: int
) -> None:
    job = view_of([accepted(0), waiting(PendingReason.WAITING_FOR_DEPENDENCY, "a", "b"), *updates]).jobs["job-1"]

    assert (job.state, job.reason, job.waiting_for) == (JobState.WAITING, reason, waiting_for)
    assert [e["event"] for e in job.timeline].count("waiting") == notes


def test_release_clears_the_waiting_reason() -> None:
    events = [accepted(0), waiting(PendingReason.WAITING_FOR_DEPENDENCY, "a"), FULL_RUN[1]]
    job = view_of(events).jobs["job-1"]

    assert (job.state, job.reason, job.message, job.waiting_for) == (JobState.READY, None, "", [])


def test_unschedulable_node_counts_are_in_the_detail_until_placed() -> None:
    counts = {"GPU model mismatch": 25, "no free GPU": 10, "load above 50%": 5}
    pending = JobUnschedulable(
        occurred_at=at(1), job_id="job-1", reason=PendingReason.NO_FIT, message="0/40 nodes", node_counts=counts
    )
    view = view_of([*FULL_RUN[:2], pending])
    detail = view.jobs["job-1"].detail()
    assert (detail["reason"], detail["message"], detail["node_counts"]) == (PendingReason.NO_FIT, "0/40 nodes", counts)

    view.apply(scheduled("job-1", occurred_at=at(2)))

    assert view.jobs["job-1"].detail()["node_counts"] == {}


def test_a_job_waiting_for_artifacts_shows_the_paths_and_the_nodes_lacking_them_until_placed() -> None:
    lacking = MissingArtifact(
        path="/data/datasets/wikitext",
        nodes=("node-0", "node-1"),
        lacking=2,
        of_nodes=2,
        host_paths={"node-0": "/srv/data/datasets/wikitext", "node-1": "/srv/data/datasets/wikitext"},
    )
    pending = JobUnschedulable(
        occurred_at=at(1),
        job_id="job-1",
        reason=PendingReason.WAITING_FOR_ARTIFACT,
        message="0/2 nodes ...; /data/datasets/wikitext absent on every node it could use (node-0, node-1)",
        node_counts={"model or dataset absent": 2},
        missing_artifacts=(lacking,),
    )
    view = view_of([*FULL_RUN[:2], pending])

    detail = view.jobs["job-1"].detail()
    assert detail["waiting_for"] == ["/data/datasets/wikitext"]
    assert detail["missing_artifacts"] == [lacking.model_dump(mode="json")]
    view.apply(scheduled("job-1", occurred_at=at(2)))
    assert (view.jobs["job-1"].detail()["waiting_for"], view.jobs["job-1"].detail()["missing_artifacts"]) == ([], [])


def test_an_unschedulable_event_from_before_missing_artifacts_still_reads() -> None:
    older = JobUnschedulable(
        occurred_at=at(1), job_id="job-1", reason=PendingReason.WAITING_FOR_ARTIFACT, message="0/2 nodes"
    ).model_dump(mode="json")
    del older["missing_artifacts"]

    detail = view_of([*FULL_RUN[:2], JobUnschedulable.model_validate(older)]).jobs["job-1"].detail()

    assert (detail["reason"], detail["waiting_for"], detail["missing_artifacts"]) == ("WAITING_FOR_ARTIFACT", [], [])


def test_degraded_placement_is_shown() -> None:
    weak = ShardPlacement(
        shard_index=1, node_id="node-v", gpu_indices=(0,), gpu_model="V100", match_score=0.4286, degraded=True
    )
    placed = scheduled("job-1", occurred_at=at(1), degraded=True)
    placed = placed.model_copy(update={"placements": (placed.placements[0], weak)})

    job = view_of([*FULL_RUN[:2], placed]).jobs["job-1"]

    detail = job.detail()
    assert detail["degraded"] is True
    assert [(p["match_score"], p["degraded"]) for p in detail["placements"]] == [(1.0, False), (0.4286, True)]
    assert "(degraded)" in job.timeline[-1]["detail"]
    assert "shard 1 -> node-v GPU (0,) degraded (match 0.43)" in job.timeline[-1]["detail"]


def _preempting(attempt: int = 1) -> JobPreempting:
    return JobPreempting(occurred_at=at(3), job_id="job-1", attempt=attempt, by_job="urgent", deadline_s=30)


def _preempted(checkpoint: str | None = "/data/checkpoints/job-1") -> JobPreempted:
    return JobPreempted(
        occurred_at=at(4),
        job_id="job-1",
        attempt=1,
        by_job="urgent",
        checkpoint_dir=checkpoint,
        checkpoint_step=120 if checkpoint else None,
    )


def test_preemption_is_in_the_timeline_and_counted_once() -> None:
    view = view_of([*FULL_RUN[:6], _preempting(), _preempting(), _preempted(), _preempted()])
    job = view.jobs["job-1"]

    assert job.state is JobState.READY
    assert [e["event"] for e in job.timeline][-2:] == ["preempting", "preempted"]
    assert "yields to urgent" in job.timeline[-2]["detail"]
    assert "checkpoint /data/checkpoints/job-1 at step 120" in job.timeline[-1]["detail"]
    assert job.message == "preempted by urgent; requeued"
    assert view.preemptions == 1


def test_a_checkpoint_whose_step_is_unsaid_is_shown_without_one() -> None:
    """A job's own script acknowledges a notice by its exit status: its checkpoint's step is not known."""
    unsaid = _preempted().model_copy(update={"checkpoint_step": None})
    view = view_of([*FULL_RUN[:6], _preempting(), unsaid])

    assert view.jobs["job-1"].timeline[-1]["detail"].endswith("; checkpoint /data/checkpoints/job-1")


def test_resumed_attempt_shows_its_checkpoint() -> None:
    resumed = scheduled("job-1", attempt=2, occurred_at=at(5), resume_from="/data/checkpoints/job-1/step-120")

    job = view_of([*FULL_RUN[:6], _preempting(), _preempted(), resumed]).jobs["job-1"]

    assert (job.attempt, job.detail()["resume_from"]) == (2, "/data/checkpoints/job-1/step-120")
    assert "resuming from /data/checkpoints/job-1/step-120" in job.timeline[-1]["detail"]


def test_preemption_without_a_checkpoint_says_it_starts_over() -> None:
    job = view_of([*FULL_RUN[:6], _preempted(None)]).jobs["job-1"]

    assert "starts over" in job.timeline[-1]["detail"]


@pytest.mark.parametrize(
    "history",
    [
        pytest.param(FULL_RUN[:1], id="accepted"),
        pytest.param([accepted(0), waiting(PendingReason.DEPENDENCY_FAILED, "a")], id="waiting"),
        pytest.param(FULL_RUN[:6], id="running"),
    ],
)
def test_cancellation_is_shown_and_counted_once(history: list[object]) -> None:
    requested = JobCancelRequested(occurred_at=at(8), job_id="job-1", requested_by="cli:alice")
    cancelled = JobCancelled(occurred_at=at(9), job_id="job-1", message="cancelled by cli:alice")

    view = view_of([*history, requested, cancelled, cancelled])
    job = view.jobs["job-1"]

    assert (job.state, job.reason, job.message, job.ended_at) == (
        JobState.CANCELLED,
        "CANCELLED",
        "cancelled by cli:alice",
        at(9),
    )
    assert [(e["event"], e["detail"]) for e in job.timeline][-2:] == [
        ("cancel requested", "by cli:alice"),
        ("cancelled", "cancelled by cli:alice"),
    ]
    assert view.cancellations == 1
    assert view.active_jobs() == 0


def test_cancel_request_for_a_finished_job_is_not_noted() -> None:
    view = view_of([*FULL_RUN, JobCancelRequested(occurred_at=at(9), job_id="job-1")])

    assert view.jobs["job-1"].timeline[-1]["event"] == "succeeded"


def test_nodes_show_drain_topology_artifacts_and_tflops() -> None:
    gpu = GpuStatus(index=0, model="A100", tflops=31.5, memory_bytes=GIB, tflops_source="measured")
    state = node_state(
        "node-a",
        draining=True,
        topology={"zone": "z1", "rack": "r2"},
        artifacts={"/data/models/gpt2": "local", "/data/datasets/wikitext": "shared"},
        gpus=(gpu,),
    )
    view = view_of([state, NodeDrain(occurred_at=at(1), node_id="node-a", draining=True)])

    (node,) = json.loads(view.nodes_body())["nodes"]

    assert (node["draining"], node["topology"], node["artifact_count"]) == (True, {"zone": "z1", "rack": "r2"}, 2)
    assert (node["gpus"][0]["tflops"], node["gpus"][0]["tflops_source"]) == (31.5, "measured")


def test_a_recovery_requeues_the_job_and_shows_in_its_timeline() -> None:
    plan = JobRecovering(
        occurred_at=at(5),
        job_id="job-1",
        attempt=1,
        cause=FailureCause.NODE_LOST,
        message="node-b silent",
        exclude_nodes=("node-b",),
        retry_at=at(5),
        retries_used=1,
        retries_left=2,
    )
    checkpoint = ShardCheckpointed(
        occurred_at=at(4), job_id="job-1", shard_index=0, attempt=1, node_id="node-a", step=200, checkpoint_dir="/c"
    )
    ratio = RedundancyChanged(
        occurred_at=at(6),
        ratio=0.1,
        previous_ratio=0.0,
        failure_rate=0.05,
        window_s=600,
        shard_attempts=20,
        shard_failures=1,
    )

    ready = JobReady(occurred_at=at(1), job_id="job-1", spec=job_spec())
    view = view_of([accepted(), ready, scheduled(), checkpoint, plan, ratio])
    job = view.jobs["job-1"].detail()

    assert job["state"] == JobState.READY and job["recoveries"] == 1
    assert job["last_checkpoint"] == {"step": 200, "dir": "/c", "attempt": 1}
    assert "recovering" in [e["event"] for e in job["timeline"]]
    assert job["message"] == "recovering from NODE_LOST; avoiding node-b"
    assert (view.recoveries, view.spare_ratio, view.failure_rate) == (1, 0.1, 0.05)


def test_a_deposed_leaders_placement_landing_late_is_fenced_not_shown() -> None:
    newer = scheduled("job-1", "node-a", "node-b", occurred_at=at(1), term=7)
    deposed = scheduled("job-1", "node-c", "node-d", occurred_at=at(2), term=5)

    job = view_of([*FULL_RUN[:2], newer, deposed]).jobs["job-1"]

    assert [p["node_id"] for p in job.detail()["placements"]] == ["node-a", "node-b"]
    assert job.timeline[-1]["event"] == "stale placement fenced"
