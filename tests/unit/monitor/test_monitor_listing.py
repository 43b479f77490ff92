"""What the CLI's listings read from the monitor: a job's owner, queue and times (``/api/jobs``), and the summary's
GPUs per model, alerts firing and leaders (``/api/summary``); and the owner and queue from submission to spec."""

from __future__ import annotations

import json

import pytest

from shardyard.admission import Admitted, Refused, admit
from shardyard.bus.codec import decode, encode
from shardyard.bus.topics import LIFECYCLE
from shardyard.events import (
    AlertFiring,
    AlertRule,
    AlertSeverity,
    GpuStatus,
    JobAccepted,
    JobReady,
    JobRunning,
    JobSucceeded,
    LeaderElected,
    NodeStatus,
    RejectReason,
)
from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.monitor.views import ClusterView
from tests.unit.builders import GIB, T0, at, job_spec, node_state, raw, scheduled, submission

JOB = "job-1"


def _admit(document: dict[str, object]) -> Admitted | Refused:
    return admit(raw(document), catalogue=DEFAULT_TFLOPS, submitted_at=T0, fallback_id="invalid-0-1")


def test_a_submission_without_owner_or_queue_gets_none_and_the_default_queue() -> None:
    result = _admit(submission())

    assert isinstance(result, Admitted)
    assert (result.spec.owner, result.spec.queue) == (None, "default")


def test_the_owner_and_queue_of_a_submission_reach_the_spec() -> None:
    result = _admit({**submission(), "owner": "alice", "queue": "research"})

    assert isinstance(result, Admitted)
    assert (result.spec.owner, result.spec.queue) == ("alice", "research")


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        pytest.param("queue", "has space", RejectReason.INVALID_VALUE, id="queue-not-a-name"),
        pytest.param("queue", "q" * 65, RejectReason.INVALID_VALUE, id="queue-too-long"),
        pytest.param("owner", "", RejectReason.INVALID_VALUE, id="owner-empty"),
        pytest.param("owner", "a\nb", RejectReason.INVALID_VALUE, id="owner-control-character"),
        pytest.param("owner", 7, RejectReason.WRONG_TYPE, id="owner-not-a-string"),
    ],
)
def test_a_bad_owner_or_queue_is_rejected(field: str, value: object, reason: RejectReason) -> None:
    result = _admit({**submission(), field: value})

    assert isinstance(result, Refused) and result.reason is reason
    assert [error.field for error in result.errors] == [field]


def test_an_accepted_event_from_before_owner_and_queue_still_decodes() -> None:
    event = JobAccepted(occurred_at=at(0), job_id=JOB, spec=job_spec(job_id=JOB), source_offset="s/0/0")
    old = json.loads(encode(event))
    del old["spec"]["owner"], old["spec"]["queue"]

    decoded = decode(LIFECYCLE, json.dumps(old).encode())

    assert isinstance(decoded, JobAccepted)
    assert (decoded.spec.owner, decoded.spec.queue) == (None, "default")


def _job(view: ClusterView) -> dict[str, object]:
    (shown,) = view.jobs_json()
    return shown


def test_the_job_listing_carries_owner_queue_and_times() -> None:
    view = ClusterView()
    spec = job_spec(job_id=JOB, owner="alice", queue="research", submitted_at=at(0))
    view.apply(JobAccepted(occurred_at=at(0), job_id=JOB, spec=spec, source_offset="s/0/0"))
    view.apply(JobReady(occurred_at=at(1), job_id=JOB, spec=spec))

    pending = _job(view)
    assert (pending["owner"], pending["queue"]) == ("alice", "research")
    assert (pending["submitted_at"], pending["started_at"], pending["ended_at"]) == (at(0).isoformat(), None, None)

    view.apply(scheduled(JOB, "node-a", occurred_at=at(2)))
    view.apply(JobRunning(occurred_at=at(3), job_id=JOB, attempt=1))
    view.apply(JobSucceeded(occurred_at=at(9), job_id=JOB, attempt=1, final_loss=1.0, checkpoint_dir="/out"))

    ended = _job(view)
    assert (ended["started_at"], ended["ended_at"]) == (at(3).isoformat(), at(9).isoformat())
    detail = view.job_detail(view.jobs[JOB], at(10))
    assert (detail["owner"], detail["queue"], detail["started_at"]) == ("alice", "research", at(3).isoformat())


def test_the_summary_counts_gpus_per_model_alerts_by_severity_and_names_the_leaders() -> None:
    view = ClusterView()
    a100 = tuple(GpuStatus(index=i, model="A100", tflops=35, memory_bytes=80 * GIB) for i in range(3))
    faulty = GpuStatus(index=3, model="A100", tflops=35, memory_bytes=80 * GIB, healthy=False)
    v100 = (GpuStatus(index=0, model="V100", tflops=15, memory_bytes=16 * GIB),)
    view.apply(node_state("node-a", gpus=(*a100, faulty), allocated_gpus=(0,)))
    view.apply(node_state("node-b", gpus=v100, draining=True))  # a draining node's GPUs are not free
    view.apply(node_state("node-c", gpus=v100, status=NodeStatus.SUSPECT))  # nor a suspect one's
    view.apply(node_state("node-d", gpus=v100, status=NodeStatus.LOST))  # a lost node's are not counted at all
    view.apply(LeaderElected(occurred_at=at(1), service="scheduler", instance="scheduler-0", term=1))
    view.apply(LeaderElected(occurred_at=at(5), service="scheduler", instance="scheduler-1", term=2))
    view.apply(
        AlertFiring(
            occurred_at=at(2),
            rule=AlertRule.NODE_SUSPECT,
            subject="node-c",
            severity=AlertSeverity.WARNING,
            summary="node-c is SUSPECT",
            value=3.5,
            threshold=0.0,
            since=at(2),
        )
    )

    summary = view.summary_json()

    assert summary["gpu_models"] == {
        "A100": {"gpus": 4, "allocated": 1, "unhealthy": 1, "free": 2},
        "V100": {"gpus": 2, "allocated": 0, "unhealthy": 0, "free": 0},
    }
    assert summary["alerts_firing"] == {"WARNING": 1, "CRITICAL": 0}
    assert summary["leaders"] == {"scheduler": {"instance": "scheduler-1", "term": 2, "since": at(5).isoformat()}}


def test_the_summary_of_an_empty_cluster() -> None:
    summary = ClusterView().summary_json()

    assert (summary["gpu_models"], summary["leaders"]) == ({}, {})
    assert sum(summary["alerts_firing"].values()) == 0
