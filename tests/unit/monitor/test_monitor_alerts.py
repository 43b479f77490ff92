"""The monitor's alert rules and book: each rule fires, stays quiet, waits out its ``for`` and resolves; the book
publishes each transition once and converges with other replicas through the view's fold of the alerts topic."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from prometheus_client import generate_latest

from shardyard.events import (
    AlertFiring,
    AlertResolved,
    AlertRule,
    AlertSeverity,
    DiskSpace,
    FailureCause,
    GpuStatus,
    JobAccepted,
    JobReady,
    JobRecovering,
    JobRunning,
    JobStraggling,
    JobSucceeded,
    JobUnschedulable,
    NodeStatus,
    PendingReason,
    StragglerAction,
    StragglerKind,
)
from shardyard.monitor.alerts import RESEND_AFTER_S, AlertBook, CatchUp
from shardyard.monitor.app import MonitorSettings
from shardyard.monitor.jobs import SyncPace
from shardyard.monitor.metrics import make_registry
from shardyard.monitor.rules import ALL_NODES, AlertPolicy
from shardyard.monitor.telemetry import Telemetry
from shardyard.monitor.views import ClusterView
from tests.support.clock import FakeClock
from tests.unit.builders import GIB, at, failed, heartbeat, job_spec, node_state, progress, scheduled

POLICY = AlertPolicy(instance="m1")
QUIET = AlertPolicy(instance="m1", heartbeat_lag_s=3600)
"""For tests of the book on one rule: a node's silence raises no HEARTBEAT_LAG beside it."""


def view_of(*facts: object) -> ClusterView:
    view = ClusterView(telemetry=Telemetry(clock=FakeClock(at())))
    for fact in facts:
        view.apply(fact)
    return view


def judge(book: AlertBook, view: ClusterView, t: float) -> list[AlertFiring | AlertResolved]:
    """Evaluate at ``t`` and fold what was published back into the view, as the alerts topic would."""
    out = book.evaluate(view, at(t))
    for event in out:
        view.apply(event)
    return out


def transitions(out: list[AlertFiring | AlertResolved]) -> list[tuple[str, AlertRule, str]]:
    return [(event.type, event.rule, event.subject) for event in out]


# --- facts ----------------------------------------------------------------------------------------------------------
SPEC = job_spec(sync_interval=100)


def ready(job_id: str = "job-1") -> list[object]:
    spec = SPEC.model_copy(update={"job_id": job_id})
    return [
        JobAccepted(occurred_at=at(0), job_id=job_id, spec=spec, source_offset="s/0/0"),
        JobReady(occurred_at=at(0), job_id=job_id, spec=spec),
    ]


def unschedulable(reason: PendingReason, t: float) -> JobUnschedulable:
    return JobUnschedulable(occurred_at=at(t), job_id="job-1", reason=reason, message="0/2 nodes")


def running(t: float = 0) -> list[object]:
    return [*ready(), scheduled(occurred_at=at(t)), JobRunning(occurred_at=at(t), job_id="job-1", attempt=1)]


def hot(temperature: float, status: NodeStatus = NodeStatus.ALIVE, t: float = 0) -> object:
    gpu = GpuStatus(index=1, model="A100", tflops=35, memory_bytes=80 * GIB, temperature_c=temperature)
    return node_state(status=status, gpus=(gpu,), occurred_at=at(t), last_heartbeat_at=at(t))


def synced(step: int, syncs: int) -> object:
    return progress(step=step, syncs=syncs, occurred_at=at(step / 10))


SYNCS_AT_100 = [synced(5, 0), synced(102, 1), synced(203, 2)]


def own(*compute_ms: float, t: float = 1) -> list[object]:
    """One report of each rank of job-1's gang: rank i's own time a step ``compute_ms[i]``."""
    return [
        progress(shard_index=i, compute_ms=ms, step_ms=max(compute_ms), occurred_at=at(t))
        for i, ms in enumerate(compute_ms)
    ]


def swapped(t: float, *, link: bool = False) -> list[object]:
    """The fault manager's verdict on job-1 at ``t``: rank 1 a slow node, swapped out (the gang re-formed without it);
    with ``link``, a slow link between two of its nodes instead (no rank, not swapped)."""
    kind, action = (StragglerKind.SLOW_LINK, StragglerAction.NOT_A_NODE) if link else (StragglerKind.SLOW_NODE, None)
    said = JobStraggling(
        occurred_at=at(t),
        job_id="job-1",
        attempt=1,
        kind=kind,
        action=action or StragglerAction.SWAP,
        shard_index=None if link else 1,
        node_id="node-a",
        peer_id="node-b" if link else None,
        ratio=2.0,
        since=at(t - 20),
    )
    if link:
        return [said]
    recovering = JobRecovering(
        occurred_at=at(t),
        job_id="job-1",
        attempt=1,
        cause=FailureCause.STRAGGLER,
        counted=False,
        message="rank 1 a straggler",
        retry_at=at(t),
        retries_used=0,
        retries_left=3,
    )
    return [said, recovering]


# --- each rule: facts, evaluation times, and what the last evaluation publishes for the rule ----------------------
FIRE, RESOLVE = "alert.firing", "alert.resolved"
SUBJECT = {
    AlertRule.GPU_OVER_TEMPERATURE: "node-a/gpu1",
    AlertRule.NODE_SUSPECT: "node-a",
    AlertRule.NODE_LOST: "node-a",
}
SUBJECT |= {AlertRule.HEARTBEAT_LAG: "node-a", AlertRule.DISK_FULL: "node-a"}


def disk(free_gib: float, t: float = 0, status: NodeStatus = NodeStatus.ALIVE) -> object:
    """node-a's state at ``t``, its output disk ``free_gib`` free of 100 GiB (the floor: 1 GiB)."""
    space = DiskSpace(path="/data/checkpoints", free_bytes=int(free_gib * GIB), total_bytes=100 * GIB)
    return node_state(status=status, output_disk=space, occurred_at=at(t), last_heartbeat_at=at(t))


def disk_full(t: float) -> object:
    return failed(cause=FailureCause.DISK_FULL, node_id="node-a", occurred_at=at(t), message="no space left")


@dataclass(frozen=True)
class Case:
    rule: AlertRule
    facts: list[object]
    times: tuple[float, ...]
    outcome: str | None
    """FIRE, RESOLVE, or None: nothing about this rule."""
    later: list[object] = field(default_factory=list)
    """Folded in before the last evaluation: the facts that end the condition (a resolution case)."""


R = AlertRule
CASES = {
    # RESOURCE_SHORTAGE: a job waits for capacity longer than 60 s (its `for`), from its reason's first event.
    "shortage-fires": Case(R.RESOURCE_SHORTAGE, [*ready(), unschedulable(PendingReason.NO_FIT, 10)], (71,), FIRE),
    "shortage-waits-for": Case(
        R.RESOURCE_SHORTAGE, [*ready(), unschedulable(PendingReason.INSUFFICIENT_GPUS, 10)], (69,), None
    ),
    "shortage-not-capacity": Case(
        R.RESOURCE_SHORTAGE, [*ready(), unschedulable(PendingReason.WAITING_FOR_ARTIFACT, 0)], (500,), None
    ),
    "shortage-same-reason-keeps-since": Case(
        R.RESOURCE_SHORTAGE,
        [*ready(), unschedulable(PendingReason.NO_FIT, 0), unschedulable(PendingReason.NO_FIT, 50)],
        (61,),
        FIRE,
    ),
    "shortage-new-reason-restarts": Case(
        R.RESOURCE_SHORTAGE,
        [*ready(), unschedulable(PendingReason.NO_FIT, 0), unschedulable(PendingReason.GPU_MODEL_MISMATCH, 50)],
        (61, 109),
        None,
    ),
    "shortage-resolves-when-placed": Case(
        R.RESOURCE_SHORTAGE,
        [*ready(), unschedulable(PendingReason.NO_FIT, 0)],
        (61, 62),
        RESOLVE,
        later=[scheduled(occurred_at=at(62))],
    ),
    # SYNC_TIMEOUT: for 300 s after a shard failed a sync.
    "sync-timeout-fires": Case(
        R.SYNC_TIMEOUT, [*running(), failed(cause=FailureCause.SYNC_TIMEOUT, occurred_at=at(5))], (6,), FIRE
    ),
    "sync-timeout-other-cause": Case(
        R.SYNC_TIMEOUT, [*running(), failed(cause=FailureCause.OOM, occurred_at=at(5))], (6,), None
    ),
    "sync-timeout-resolves-after-window": Case(
        R.SYNC_TIMEOUT, [*running(), failed(cause=FailureCause.SYNC_TIMEOUT, occurred_at=at(5))], (6, 306), RESOLVE
    ),
    # SLOW_SYNC: rank 0's syncs come ~2x the asked interval apart.
    "slow-sync-fires": Case(R.SLOW_SYNC, [*running(), *SYNCS_AT_100, synced(405, 3)], (41,), FIRE),
    "slow-sync-on-pace": Case(R.SLOW_SYNC, [*running(), *SYNCS_AT_100, synced(304, 3)], (41,), None),
    "slow-sync-resolves-when-job-ends": Case(
        R.SLOW_SYNC,
        [*running(), *SYNCS_AT_100, synced(405, 3)],
        (41, 42),
        RESOLVE,
        later=[JobSucceeded(occurred_at=at(42), job_id="job-1", attempt=1, final_loss=1.0, checkpoint_dir="/c")],
    ),
    # NODE_SUSPECT / NODE_LOST: the pool's verdict, at once.
    "suspect-fires": Case(R.NODE_SUSPECT, [node_state(status=NodeStatus.SUSPECT)], (3,), FIRE),
    "suspect-alive": Case(R.NODE_SUSPECT, [node_state()], (1,), None),
    "suspect-resolves": Case(
        R.NODE_SUSPECT,
        [node_state(status=NodeStatus.SUSPECT)],
        (3, 4),
        RESOLVE,
        later=[node_state(occurred_at=at(4), last_heartbeat_at=at(4))],
    ),
    "lost-fires": Case(R.NODE_LOST, [node_state(status=NodeStatus.LOST)], (11,), FIRE),
    "lost-alive": Case(R.NODE_LOST, [node_state(status=NodeStatus.SUSPECT)], (5,), None),
    # GPU_OVER_TEMPERATURE: above 85 C for 30 s.
    "hot-gpu-fires": Case(R.GPU_OVER_TEMPERATURE, [hot(90)], (0, 30), FIRE),
    "hot-gpu-waits-for": Case(R.GPU_OVER_TEMPERATURE, [hot(90)], (0, 29), None),
    "hot-gpu-cool": Case(R.GPU_OVER_TEMPERATURE, [hot(85)], (0, 30), None),
    "hot-gpu-of-lost-node": Case(R.GPU_OVER_TEMPERATURE, [hot(95, NodeStatus.LOST)], (0, 30), None),
    "hot-gpu-resolves": Case(R.GPU_OVER_TEMPERATURE, [hot(90)], (0, 30, 31), RESOLVE, later=[hot(70, t=31)]),
    "hot-gpu-resolves-when-readings-stop": Case(
        R.GPU_OVER_TEMPERATURE, [hot(90)], (0, 30, 31), RESOLVE, later=[node_state(occurred_at=at(31))]
    ),
    # HEARTBEAT_LAG: the newest heartbeat over 2 s old, LOST nodes aside.
    "heartbeat-lag-fires": Case(R.HEARTBEAT_LAG, [node_state(), heartbeat()], (2.5,), FIRE),
    "heartbeat-fresh": Case(R.HEARTBEAT_LAG, [node_state(), heartbeat()], (1.5,), None),
    "heartbeat-newest-of-pool-and-agent": Case(
        R.HEARTBEAT_LAG, [heartbeat(occurred_at=at(2)), node_state(last_heartbeat_at=at(1))], (3.5,), None
    ),
    "heartbeat-of-lost-node": Case(R.HEARTBEAT_LAG, [node_state(status=NodeStatus.LOST)], (30,), None),
    "heartbeat-lag-resolves": Case(
        R.HEARTBEAT_LAG, [heartbeat()], (2.5, 3), RESOLVE, later=[heartbeat(occurred_at=at(3))]
    ),
    # NO_PROGRESS: a running job's newest progress (or its start) over 120 s old.
    "no-progress-fires": Case(R.NO_PROGRESS, [*running(), progress(occurred_at=at(10))], (131,), FIRE),
    "no-progress-never-reported": Case(R.NO_PROGRESS, [*running(5)], (126,), FIRE),
    "no-progress-recent": Case(R.NO_PROGRESS, [*running(), progress(occurred_at=at(10))], (129,), None),
    "no-progress-not-running": Case(R.NO_PROGRESS, [*ready()], (500,), None),
    "no-progress-resolves": Case(
        R.NO_PROGRESS, [*running()], (121, 130), RESOLVE, later=[progress(occurred_at=at(129))]
    ),
    # DISK_FULL: a node's output disk below 1 GiB free, or a shard failed DISK_FULL there within 300 s.
    "disk-below-the-floor-fires": Case(R.DISK_FULL, [disk(0.5)], (1,), FIRE),
    "disk-with-room": Case(R.DISK_FULL, [disk(1.0)], (1,), None),
    "disk-not-reported": Case(R.DISK_FULL, [node_state()], (1,), None),
    "disk-of-lost-node": Case(R.DISK_FULL, [disk(0, status=NodeStatus.LOST)], (1,), None),
    "disk-full-failure-fires-above-the-floor": Case(R.DISK_FULL, [disk(5), disk_full(5)], (6,), FIRE),
    "disk-full-failure-on-another-node": Case(
        R.DISK_FULL, [disk(5), failed(cause=FailureCause.DISK_FULL, node_id="node-b")], (6,), None
    ),
    "disk-full-failure-resolves-after-window": Case(R.DISK_FULL, [disk(5), disk_full(5)], (6, 306), RESOLVE),
    "disk-resolves-when-cleaned-up": Case(R.DISK_FULL, [disk(0)], (1, 2), RESOLVE, later=[disk(50, t=2)]),
    # STRAGGLER: a rank's own time a step 1.4x the other ranks' median or more, for 20 s.
    "straggler-fires": Case(R.STRAGGLER, [*running(), *own(100, 200)], (1, 21), FIRE),
    "straggler-waits-for": Case(R.STRAGGLER, [*running(), *own(100, 200)], (1, 20), None),
    "straggler-within-the-bound": Case(R.STRAGGLER, [*running(), *own(100, 135)], (1, 30), None),
    "straggler-resolves": Case(
        R.STRAGGLER, [*running(), *own(100, 200)], (1, 21, 22), RESOLVE, later=own(100, 100, t=22)
    ),
    # ... or the fault manager's verdict on a rank: at once, for 60 s, swapped out (re-formed) or not.
    "straggler-verdict-fires-at-once": Case(R.STRAGGLER, [*running(), *own(100, 100), *swapped(10)], (10,), FIRE),
    "straggler-verdict-on-a-link-is-not-one": Case(
        R.STRAGGLER, [*running(), *own(100, 100), *swapped(10, link=True)], (10, 40), None
    ),
    "straggler-verdict-holds-for-its-time": Case(
        R.STRAGGLER, [*running(), *own(100, 100), *swapped(10)], (10, 70), None
    ),
    "straggler-verdict-resolves": Case(R.STRAGGLER, [*running(), *own(100, 100), *swapped(10)], (10, 71), RESOLVE),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_rule(case: Case) -> None:
    view, book = view_of(*case.facts), AlertBook(POLICY)

    out: list[AlertFiring | AlertResolved] = []
    for index, t in enumerate(case.times):
        if index == len(case.times) - 1:
            for fact in case.later:
                view.apply(fact)
        out = judge(book, view, t)

    expected = [(case.outcome, case.rule, SUBJECT.get(case.rule, "job-1"))] if case.outcome else []
    assert [found for found in transitions(out) if found[1] is case.rule] == expected


def test_a_firing_carries_what_and_since_when() -> None:
    view = view_of(*ready(), unschedulable(PendingReason.NO_FIT, 10))

    (alert,) = judge(AlertBook(POLICY), view, 71)

    assert isinstance(alert, AlertFiring)
    assert (alert.severity, alert.value, alert.threshold, alert.since) == (AlertSeverity.WARNING, 61, 60, at(10))
    assert alert.summary == "job-1 waits for capacity for 61 s: NO_FIT: 0/2 nodes"
    assert view.alerts.json()["firing"][0]["subject"] == "job-1"


def test_lost_is_critical() -> None:
    (alert,) = judge(AlertBook(POLICY), view_of(node_state(status=NodeStatus.LOST)), 11)

    assert alert.severity is AlertSeverity.CRITICAL


def test_slow_heartbeat_transit_counts_as_lag() -> None:
    view = ClusterView(telemetry=Telemetry(clock=FakeClock(at(3))))
    view.apply(heartbeat(occurred_at=at(0)))  # arrives 3 s after it was sent

    assert transitions(judge(AlertBook(POLICY), view, 0.5)) == [(FIRE, AlertRule.HEARTBEAT_LAG, "node-a")]


@pytest.mark.parametrize("rule", [AlertRule.NODE_SUSPECT, AlertRule.HEARTBEAT_LAG])
def test_many_nodes_at_once_make_one_alert_on_all_of_them(rule: AlertRule) -> None:
    policy = AlertPolicy(instance="m1", node_alerts_grouped_over=3)
    few = [node_state(f"node-{i}", status=NodeStatus.SUSPECT) for i in range(3)]
    many = [*few, node_state("node-3", status=NodeStatus.SUSPECT)]

    alone = {subject for _, fired, subject in transitions(judge(AlertBook(policy), view_of(*few), 3)) if fired is rule}
    (grouped,) = [alert for alert in judge(AlertBook(policy), view_of(*many), 3) if alert.rule is rule]

    assert alone == {"node-0", "node-1", "node-2"}
    assert (grouped.subject, grouped.value) == (ALL_NODES, 4.0)
    assert "4 nodes" in grouped.summary and "node-0, node-1, node-2, node-3" in grouped.summary


def test_lost_nodes_are_never_grouped() -> None:
    lost = [node_state(f"node-{i}", status=NodeStatus.LOST) for i in range(4)]

    fired = judge(AlertBook(AlertPolicy(instance="m1", node_alerts_grouped_over=3)), view_of(*lost), 11)

    assert sorted(a.subject for a in fired if a.rule is AlertRule.NODE_LOST) == [f"node-{i}" for i in range(4)]


# --- consumer lag: judged only by the replica it is about -------------------------------------------------------------
def test_consumer_lag_fires_after_its_for_and_resolves() -> None:
    view, book = view_of(), AlertBook(POLICY)
    view.consumer_lag = {"shardyard.nodes.heartbeats": 1500, "shardyard.jobs.lifecycle": 10}

    assert judge(book, view, 0) == []
    assert transitions(judge(book, view, 30)) == [(FIRE, AlertRule.CONSUMER_LAG, "monitor/m1")]
    view.consumer_lag = {"shardyard.nodes.heartbeats": 0}
    assert transitions(judge(book, view, 31)) == [(RESOLVE, AlertRule.CONSUMER_LAG, "monitor/m1")]


def test_another_replicas_lag_is_not_resolved_here() -> None:
    other = AlertBook(AlertPolicy(instance="m2"))
    view = view_of()
    view.consumer_lag = {"t": 5000}
    judge(other, view, 0)
    judge(other, view, 30)
    view.consumer_lag = {}

    assert judge(AlertBook(POLICY), view, 31) == []
    assert "CONSUMER_LAG/monitor/m2" in view.alerts.firing


# --- the book: once per transition, converging replicas -----------------------------------------------------------
def test_a_transition_is_published_once_until_the_view_echoes_it() -> None:
    view, book = view_of(node_state(status=NodeStatus.SUSPECT)), AlertBook(QUIET)

    first = book.evaluate(view, at(3))
    assert transitions(first) == [(FIRE, AlertRule.NODE_SUSPECT, "node-a")]
    assert book.evaluate(view, at(3.5)) == []  # published, not folded yet: not again
    again = book.evaluate(view, at(3.5 + RESEND_AFTER_S + 0.1))  # never echoed: published again
    assert [e.event_id for e in again] == [first[0].event_id]
    view.apply(again[0])
    assert book.evaluate(view, at(20)) == []


def test_two_replicas_deciding_at_once_fold_into_one_alert() -> None:
    facts = [node_state(status=NodeStatus.SUSPECT)]
    view_a, view_b = view_of(*facts), view_of(*facts)
    a, b = AlertBook(replace(QUIET, instance="a")), AlertBook(replace(QUIET, instance="b"))

    log: list[AlertFiring | AlertResolved] = [*a.evaluate(view_a, at(3)), *b.evaluate(view_b, at(3.01))]
    assert len(log) == 2 and log[0].event_id == log[1].event_id  # since comes from the data: the same id
    for view in (view_a, view_b):
        view.apply(node_state(occurred_at=at(4), last_heartbeat_at=at(4)))
        for event in log:
            view.apply(event)
    log = [*a.evaluate(view_a, at(4.5)), *b.evaluate(view_b, at(4.51))]
    for view in (view_a, view_b):
        for event in log:
            view.apply(event)

    for view in (view_a, view_b):
        assert view.alerts.firing == {}
        assert [e.type for e in view.alerts.history] == [FIRE, RESOLVE]


def test_a_resolution_of_an_earlier_episode_is_ignored() -> None:
    view = view_of(node_state(status=NodeStatus.SUSPECT, last_heartbeat_at=at(10)))
    (firing,) = judge(AlertBook(QUIET), view, 13)
    stale = AlertResolved(
        occurred_at=at(14),
        rule=firing.rule,
        subject=firing.subject,
        severity=firing.severity,
        summary="old",
        threshold=0,
        since=at(0),
    )

    view.apply(stale)

    assert list(view.alerts.firing.values()) == [firing]


def test_a_holding_condition_is_not_resolved_while_its_for_restarts() -> None:
    view, book = view_of(hot(90)), AlertBook(QUIET)
    judge(book, view, 0)
    judge(book, view, 30)
    assert "GPU_OVER_TEMPERATURE/node-a/gpu1" in view.alerts.firing

    assert judge(AlertBook(QUIET), view, 31) == []  # a restarted replica: its `for` clock starts again


# --- what the view keeps for the rules ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reports", "expected"),
    [
        pytest.param([(1, 5, 0), (1, 102, 1), (1, 203, 2)], 101, id="gap-between-two-sightings"),
        pytest.param([(1, 5, 0), (1, 150, 1)], None, id="first-sighting-only-marks"),
        pytest.param([(1, 102, 1), (1, 203, 2), (1, 610, 4)], 203.5, id="two-syncs-between-reports"),
        pytest.param([(1, 102, 1), (1, 203, 2), (2, 250, 0)], None, id="new-attempt-starts-over"),
    ],
)
def test_sync_pace(reports: list[tuple[int, int, int]], expected: float | None) -> None:
    pace = SyncPace()
    for attempt, step, syncs in reports:
        pace.observe(attempt, step, syncs)

    assert pace.steps_per_sync == expected


@pytest.mark.parametrize(
    ("lag", "elapsed", "done"),
    [
        pytest.param(None, 1.0, False, id="not-measured"),
        pytest.param({"t": 500}, 1.0, False, id="replaying"),
        pytest.param({"t": 3, "u": 0}, 1.0, True, id="caught-up"),
        pytest.param(None, 60.0, True, id="gives-up-waiting"),
    ],
)
def test_catch_up(lag: dict[str, int] | None, elapsed: float, done: bool) -> None:
    assert CatchUp(started_at=100.0).observe(lag, 100.0 + elapsed) is done


def test_settings_set_every_threshold() -> None:
    settings = MonitorSettings(instance="m7", alert_no_progress_s=5, alert_gpu_temperature_c=70)

    policy = settings.alert_policy()

    assert (policy.instance, policy.no_progress_s, policy.gpu_temperature_c) == ("m7", 5, 70)
    assert policy.resource_shortage_s == AlertPolicy().resource_shortage_s


def test_metrics_export_alerts_and_what_the_rules_judge() -> None:
    view = view_of(node_state(status=NodeStatus.SUSPECT), *ready(), unschedulable(PendingReason.NO_FIT, 10))
    view.consumer_lag = {"shardyard.alerts": 2}
    judge(AlertBook(POLICY), view, 3)

    scraped = generate_latest(make_registry(view)[0]).decode().splitlines()

    assert 'shardyard_alerts_firing{rule="NODE_SUSPECT"} 1.0' in scraped
    assert 'shardyard_alerts_firing{rule="NO_PROGRESS"} 0.0' in scraped
    assert 'shardyard_monitor_consumer_lag_messages{topic="shardyard.alerts"} 2.0' in scraped
    assert 'shardyard_node_status{node="node-a",status="SUSPECT"} 1.0' in scraped
    assert 'shardyard_node_status{node="node-a",status="ALIVE"} 0.0' in scraped
    values = dict(line.rsplit(" ", 1) for line in scraped if not line.startswith("#"))
    assert float(values['shardyard_node_last_heartbeat_timestamp_seconds{node="node-a"}']) == at(0).timestamp()
    waiting = 'shardyard_job_capacity_wait_since_timestamp_seconds{job="job-1",reason="NO_FIT"}'
    assert float(values[waiting]) == at(10).timestamp()


def test_a_full_disk_says_how_full_and_what_failed_there() -> None:
    view = view_of(disk(0.25), disk_full(5))

    (firing,) = [e for e in judge(AlertBook(QUIET), view, 6) if isinstance(e, AlertFiring)]

    assert (firing.rule, firing.subject, firing.value, firing.threshold) == (R.DISK_FULL, "node-a", GIB / 4, GIB)
    assert firing.since == at(5)
    assert firing.summary == (
        "node-a's output disk (/data/checkpoints): 256MiB free, floor 1GiB; "
        "job-1 shard 0 failed DISK_FULL there: no space left"
    )


def test_metrics_export_the_disks_the_disk_full_rule_judges() -> None:
    scraped = generate_latest(make_registry(view_of(disk(0.25), disk_full(5)))[0]).decode().splitlines()

    values = dict(line.rsplit(" ", 1) for line in scraped if not line.startswith("#"))
    assert float(values['shardyard_node_disk_free_bytes{node="node-a"}']) == GIB / 4
    assert float(values['shardyard_node_disk_total_bytes{node="node-a"}']) == 100 * GIB
    assert float(values['shardyard_node_disk_full_timestamp_seconds{node="node-a"}']) == at(5).timestamp()


def test_a_straggler_left_in_place_is_named_with_what_the_fault_manager_did_after_its_verdict_aged() -> None:
    """No better place: the rank stays, its verdict's 60 s pass, and its own times keep the alert up; the summary
    still says what the fault manager did."""
    kept = swapped(1)[0].model_copy(update={"action": StragglerAction.NO_BETTER_PLACE})
    view, book = view_of(*running(), *own(100, 200), kept), AlertBook(POLICY)

    judge(book, view, 62)  # the verdict is 61 s old: its own times count, and wait out their 20 s
    (fired,) = judge(book, view, 83)

    assert fired.rule is AlertRule.STRAGGLER and fired.summary.endswith("the fault manager: SLOW_NODE, NO_BETTER_PLACE")
