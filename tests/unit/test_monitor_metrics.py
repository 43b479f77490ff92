"""The monitor's /metrics, computed from the cluster view: queue depth, preemptions, cancellations, drained nodes."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from shardyard.events import (
    JobAccepted,
    JobCancelled,
    JobPreempted,
    JobReady,
    JobRunning,
    JobUnschedulable,
    JobWaiting,
    PendingReason,
)
from shardyard.monitor.metrics import make_registry
from shardyard.monitor.views import ClusterView
from tests.unit.builders import at, job_spec, node_state, scheduled


def accept(job_id: str, priority: int) -> list[object]:
    spec = job_spec(job_id=job_id, priority=priority)
    return [JobAccepted(occurred_at=at(0), job_id=job_id, spec=spec, source_offset=f"s/0/{job_id}")]


def ready(job_id: str, priority: int) -> list[object]:
    spec = job_spec(job_id=job_id, priority=priority)
    return [*accept(job_id, priority), JobReady(occurred_at=at(1), job_id=job_id, spec=spec)]


def unschedulable(job_id: str, priority: int, reason: PendingReason) -> list[object]:
    pending = JobUnschedulable(occurred_at=at(2), job_id=job_id, reason=reason, message="no")
    return [*ready(job_id, priority), pending]


def waiting(job_id: str, priority: int) -> list[object]:
    held = JobWaiting(
        occurred_at=at(1), job_id=job_id, reason=PendingReason.WAITING_FOR_DEPENDENCY, message="m", waiting_for=("p",)
    )
    return [*accept(job_id, priority), held]


def running(job_id: str, priority: int) -> list[object]:
    return [*ready(job_id, priority), scheduled(job_id), JobRunning(occurred_at=at(3), job_id=job_id, attempt=1)]


def preempted(job_id: str) -> JobPreempted:
    return JobPreempted(
        occurred_at=at(4), job_id=job_id, attempt=1, by_job="vip", checkpoint_dir=None, checkpoint_step=None
    )


def scrape(*events: object) -> str:
    view = ClusterView()
    for event in events:
        view.apply(event)
    registry, _ = make_registry(view)
    return generate_latest(registry).decode()


@pytest.mark.parametrize(
    ("events", "line"),
    [
        pytest.param(ready("a", 5), 'shardyard_queue_jobs{priority="5",reason="NONE"} 1.0', id="ready-no-reason"),
        pytest.param(
            [*unschedulable("a", 5, PendingReason.NO_FIT), *unschedulable("b", 5, PendingReason.NO_FIT)],
            'shardyard_queue_jobs{priority="5",reason="NO_FIT"} 2.0',
            id="by-reason",
        ),
        pytest.param(
            waiting("a", 0), 'shardyard_queue_jobs{priority="0",reason="WAITING_FOR_DEPENDENCY"} 1.0', id="waiting"
        ),
        pytest.param(accept("a", 9), 'shardyard_queue_jobs{priority="9",reason="NONE"} 1.0', id="accepted"),
        pytest.param(
            [*running("a", 1), preempted("a"), preempted("a")], "shardyard_preemptions_total 1.0", id="preemptions"
        ),
        pytest.param(
            [*running("a", 1), preempted("a")],
            'shardyard_queue_jobs{priority="1",reason="NONE"} 1.0',
            id="preempted-job-is-queued-again",
        ),
        pytest.param(
            [*ready("a", 1), JobCancelled(occurred_at=at(5), job_id="a", message="m")] * 2,
            "shardyard_cancellations_total 1.0",
            id="cancellations",
        ),
        pytest.param(
            [node_state("n1", draining=True), node_state("n2")], "shardyard_nodes_draining 1.0", id="drained-nodes"
        ),
    ],
)
def test_metric(events: list[object], line: str) -> None:
    assert line in scrape(*events).splitlines()


@pytest.mark.parametrize(
    "events",
    [
        pytest.param(running("a", 5), id="running"),
        pytest.param([*ready("a", 5), JobCancelled(occurred_at=at(5), job_id="a", message="m")], id="cancelled"),
    ],
)
def test_placed_and_finished_jobs_are_not_queued(events: list[object]) -> None:
    assert "shardyard_queue_jobs{" not in scrape(*events)


def test_counters_start_at_zero() -> None:
    lines = scrape().splitlines()

    assert "shardyard_preemptions_total 0.0" in lines
    assert "shardyard_cancellations_total 0.0" in lines
