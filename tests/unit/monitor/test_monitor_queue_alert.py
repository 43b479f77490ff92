"""QUEUE_STARVED: a queue whose READY job fits in its nominal quota has waited with a pending reason longer than the
queues file's ``starving_after_s``; and the metrics its Prometheus twin reads."""

import pytest
from prometheus_client import generate_latest

from shardyard.events import (
    AlertFiring,
    AlertResolved,
    AlertRule,
    JobAccepted,
    JobReady,
    JobUnschedulable,
    PendingReason,
    QueuesConfigured,
)
from shardyard.monitor.alerts import AlertBook
from shardyard.monitor.metrics import make_registry
from shardyard.monitor.rules import AlertPolicy
from shardyard.monitor.telemetry import Telemetry
from shardyard.monitor.views import ClusterView
from shardyard.quotas import parse_queues
from tests.support.clock import FakeClock
from tests.unit.builders import at, gpus, job_spec, node_state, scheduled

QUEUES = "starving_after_s: 60\nqueues:\n  team-a: {gpus: {A100: 2}}\n  team-b: {gpus: {A100: 2}}\n"


def configured() -> QueuesConfigured:
    return QueuesConfigured(
        occurred_at=at(0), config=parse_queues(QUEUES), version="b" * 64, source="q.yaml", published_by="test"
    )


def waiting(job_id: str, queue: str, need: int, since: float) -> list[object]:
    spec = job_spec(job_id=job_id, queue=queue, gpu_count=need)
    return [
        JobAccepted(occurred_at=at(0), job_id=job_id, spec=spec, source_offset=f"s/0/{job_id}"),
        JobReady(occurred_at=at(0), job_id=job_id, spec=spec),
        JobUnschedulable(occurred_at=at(since), job_id=job_id, reason=PendingReason.NO_FIT, message="0/1 nodes"),
    ]


def view_of(*facts: object) -> ClusterView:
    view = ClusterView(telemetry=Telemetry(clock=FakeClock(at())))
    for fact in (node_state("node-a", gpus=gpus("A100", 4)), *facts):
        view.apply(fact)
    return view


def starved(book: AlertBook, view: ClusterView, t: float) -> list[tuple[str, str]]:
    out = book.evaluate(view, at(t))
    for event in out:
        view.apply(event)
    return [
        (e.type, e.subject)
        for e in out
        if isinstance(e, AlertFiring | AlertResolved) and e.rule is AlertRule.QUEUE_STARVED
    ]


@pytest.mark.parametrize(
    ("facts", "t", "expected"),
    [
        ([configured(), *waiting("j", "team-a", 2, 10)], 71, [("alert.firing", "team-a")]),
        ([configured(), *waiting("j", "team-a", 2, 10)], 69, []),  # not for long enough
        ([configured(), *waiting("j", "team-a", 3, 10)], 500, []),  # beyond its nominal: it waits to borrow
        ([*waiting("j", "team-a", 2, 10)], 500, []),  # no queues file in force
    ],
    ids=["fires", "not-yet", "beyond-nominal", "no-queues"],
)
def test_a_queue_waiting_for_its_nominal_quota_starves(facts: list[object], t: float, expected: list[object]) -> None:
    assert starved(AlertBook(AlertPolicy(instance="m1")), view_of(*facts), t) == expected


def test_placing_the_job_resolves_it_and_the_metrics_say_since_when() -> None:
    view, book = view_of(configured(), *waiting("j", "team-a", 2, 10)), AlertBook(AlertPolicy(instance="m1"))
    assert starved(book, view, 71) == [("alert.firing", "team-a")]
    exposition = generate_latest(make_registry(view)[0]).decode()
    assert 'shardyard_queue_starving_since_timestamp_seconds{queue="team-a"} 1.76722561e+09' in exposition  # at(10)
    assert "shardyard_queue_starving_after_seconds 60.0" in exposition
    assert 'shardyard_queue_gpus{kind="pending",model="A100",queue="team-a"} 2.0' in exposition

    view.apply(scheduled("j", "node-a", "node-a", occurred_at=at(72)))

    assert starved(book, view, 73) == [("alert.resolved", "team-a")]
