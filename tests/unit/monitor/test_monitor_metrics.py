"""The monitor's /metrics, computed from the cluster view: queue depth, preemptions, cancellations, drained nodes,
GPUs, per-shard training and AllReduce figures, heartbeat lag, node RTTs, shard failures and recovery times."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shardyard.events import (
    FailureCause,
    GpuStatus,
    JobAccepted,
    JobCancelled,
    JobPreempted,
    JobReady,
    JobRecovering,
    JobRunning,
    JobSucceeded,
    JobUnschedulable,
    JobWaiting,
    NodeStatus,
    PendingReason,
    lease_of,
)
from shardyard.monitor.metrics import MonitorMetrics, make_registry, mean_rtt_ms
from shardyard.monitor.telemetry import Telemetry
from shardyard.monitor.views import ClusterView
from shardyard.placement.snapshot import build_snapshot
from shardyard.topology import estimated_rtt_ms
from tests.support.clock import FakeClock
from tests.unit.builders import GIB, at, failed, gpus, heartbeat, job_spec, node_state, progress, relayed, scheduled


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
    """What ``/metrics`` serves after ``events``."""
    view = ClusterView()
    for event in events:
        view.apply(event)
    return MonitorMetrics(view).exposition().decode()


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


# --- figures S7 asks for --------------------------------------------------------------------------------------------
def value(text: str, name: str, **labels: str) -> float | None:
    """The sample ``name{labels}`` of a scrape (the only one when ``labels`` is empty), or None."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def succeeded(job_id: str) -> JobSucceeded:
    return JobSucceeded(occurred_at=at(50), job_id=job_id, attempt=1, final_loss=2.0, checkpoint_dir="/c")


def recovering(job_id: str, attempt: int, seconds: float) -> JobRecovering:
    return JobRecovering(
        occurred_at=at(seconds),
        job_id=job_id,
        attempt=attempt,
        cause=FailureCause.NODE_LOST,
        message="node-b lost",
        retry_at=at(seconds),
        retries_used=attempt,
        retries_left=3 - attempt,
    )


def test_gpus_carry_node_gpu_and_model_with_memory_used_and_total() -> None:
    node = node_state("n1", gpus=gpus("V100", count=1, tflops=15.0, memory_gib=16))
    text = scrape(node)
    labels = {"node": "n1", "gpu": "0", "model": "V100"}

    assert value(text, "shardyard_gpu_memory_total_bytes", **labels) == 16 * 2**30
    assert value(text, "shardyard_gpu_memory_used_bytes", **labels) == 0
    assert value(text, "shardyard_gpu_utilization_ratio", **labels) == 0
    assert value(text, "shardyard_gpu_healthy", **labels) == 1


def test_cpu_load_and_gpu_use_are_the_newest_beats_not_the_last_published_state() -> None:
    node = node_state("n1", gpus=gpus(count=2), cpu_load=0.1)
    lease = lease_of(heartbeat("n1", cpu_load=0.13)).model_copy(
        update={"gpu_utilization": (0.04, 0.07), "gpu_memory_used_bytes": (GIB, 2 * GIB)}
    )
    text = scrape(node, lease)

    assert value(text, "shardyard_node_cpu_load_ratio", node="n1") == 0.13
    assert value(text, "shardyard_gpu_utilization_ratio", node="n1", gpu="1") == 0.07
    assert value(text, "shardyard_gpu_memory_used_bytes", node="n1", gpu="0") == GIB
    restarted = lease.model_copy(update={"agent_instance": "another", "cpu_load": 0.5})
    assert value(scrape(node, restarted), "shardyard_gpu_utilization_ratio", node="n1", gpu="1") == 0.0


def test_a_relayed_lease_is_the_nodes_newest_beat_as_its_own_would_be() -> None:
    node = node_state("n1", gpus=gpus(count=2), cpu_load=0.1)
    relayed_leases = relayed("rack-1", heartbeat("n2", cpu_load=0.3), heartbeat("n1", cpu_load=0.13))

    text = scrape(node, relayed_leases)

    assert value(text, "shardyard_node_cpu_load_ratio", node="n1") == 0.13


def test_shard_figures_are_exported_while_the_job_runs_and_end_with_it() -> None:
    report = progress("a", 1, step=40, loss=3.5, samples_per_s=250.0)
    live = scrape(*running("a", 5), report)
    ended = scrape(*running("a", 5), report, succeeded("a"))

    assert value(live, "shardyard_shard_step", job="a", shard="1") == 40
    assert value(live, "shardyard_shard_loss", job="a", shard="1") == 3.5
    assert value(live, "shardyard_shard_samples_per_second", job="a", shard="1") == 250.0
    assert value(ended, "shardyard_shard_step", job="a", shard="1") is None


def test_allreduce_counters_sum_every_sync_across_attempts_so_the_transfer_rate_is_derivable() -> None:
    reports = [
        progress("a", 0, syncs=1, allreduce_ms=200.0, allreduce_bytes=1000),
        progress("a", 0, syncs=1, allreduce_ms=200.0, allreduce_bytes=1000),  # a report between syncs
        progress("a", 0, syncs=3, allreduce_ms=100.0, allreduce_bytes=1000),  # two syncs since the last report
        progress("a", 0, attempt=2, syncs=1, allreduce_ms=300.0, allreduce_bytes=1000),  # a new runner counts from 0
        progress("a", 0, attempt=1, syncs=9, allreduce_ms=1.0, allreduce_bytes=1),  # late, from the replaced attempt
    ]
    text = scrape(*running("a", 5), *reports)
    shard = {"job": "a", "shard": "0"}

    assert value(text, "shardyard_allreduce_syncs_total", **shard) == 4
    assert value(text, "shardyard_allreduce_seconds_total", **shard) == pytest.approx(0.2 + 0.2 + 0.3)
    assert value(text, "shardyard_allreduce_bytes_total", **shard) == 4000


def test_heartbeat_lag_is_arrival_minus_occurred_at_for_nodes_not_lost() -> None:
    view = ClusterView(telemetry=Telemetry(clock=FakeClock(at(10.25))))
    for event in [
        heartbeat("n1", occurred_at=at(10)),
        heartbeat("n2", occurred_at=at(4)),
        node_state("n1"),
        node_state("n2", status=NodeStatus.LOST),
    ]:
        view.apply(event)
    text = generate_latest(make_registry(view)[0]).decode()

    assert value(text, "shardyard_heartbeat_lag_seconds", node="n1") == 0.25
    assert value(text, "shardyard_heartbeat_lag_seconds", node="n2") is None


def topology(node_id: str, zone: str, rack: str) -> object:
    return node_state(node_id, topology={"zone": zone, "rack": rack})


def test_node_rtts_are_the_schedulers_topology_estimates() -> None:
    text = scrape(topology("n1", "a", "r1"), topology("n2", "a", "r1"), topology("n3", "b", "r1"))
    rtt = "shardyard_node_rtt_seconds"

    assert value(text, rtt, node="n1", peer="n2", source="topology") == pytest.approx(0.0001)  # same rack
    assert value(text, rtt, node="n1", peer="n3", source="topology") == pytest.approx(0.005)  # other zone
    assert value(text, rtt, node="n2", peer="n1") is None  # each pair once
    assert value(text, "shardyard_node_mean_rtt_seconds", node="n1") == pytest.approx((0.0001 + 0.005) / 2)


@pytest.mark.parametrize(
    "places",
    [
        pytest.param([("a", "r1")] * 3, id="one-rack"),
        pytest.param([("a", "r1"), ("a", "r2"), ("b", "r1"), ("", ""), ("a", "r1")], id="mixed"),
        pytest.param([("", "")] * 2, id="unlabelled"),
    ],
)
def test_mean_rtt_by_group_equals_the_mean_over_every_pair(places: list[tuple[str, str]]) -> None:
    states = [node_state(f"n{i}", topology={"zone": z, "rack": r}) for i, (z, r) in enumerate(places)]
    nodes = build_snapshot(states, ()).nodes
    expected = {
        a.node_id: sum(estimated_rtt_ms(a, b, {}) for b in nodes if b is not a) / (len(nodes) - 1) for a in nodes
    }

    assert mean_rtt_ms(states) == pytest.approx(expected)


def test_shard_failures_count_each_attempt_once_by_cause_from_zero() -> None:
    oom = failed("a", 0, cause=FailureCause.OOM)
    text = scrape(oom, oom, failed("a", 1, cause=FailureCause.OOM), failed("a", 0, attempt=2))

    assert value(text, "shardyard_shard_failures_total", cause="OOM") == 2
    assert value(text, "shardyard_shard_failures_total", cause="PROCESS_EXIT") == 1
    assert value(text, "shardyard_shard_failures_total", cause="GPU_FAULT") == 0
    assert value(text, "shardyard_shard_failures_total", cause="START_TIMEOUT") == 0  # every cause, from zero


def test_recovery_time_runs_from_the_first_plan_to_the_new_gangs_first_progress() -> None:
    text = scrape(
        *running("a", 5),
        recovering("a", 1, seconds=10),
        progress("a", 1, occurred_at=at(11)),  # the failed attempt's last word: not the new gang
        recovering("a", 2, seconds=14),  # the retry failed too: the outage goes on
        progress("a", 0, attempt=3, occurred_at=at(17)),
        progress("a", 1, attempt=3, occurred_at=at(18)),
    )

    assert value(text, "shardyard_recovery_seconds_count") == 1
    assert value(text, "shardyard_recovery_seconds_sum") == 7
    assert value(text, "shardyard_recovery_seconds_bucket", le="5.0") == 0
    assert value(text, "shardyard_recovery_seconds_bucket", le="10.0") == 1


def test_a_job_that_ends_while_recovering_records_no_recovery() -> None:
    text = scrape(*running("a", 5), recovering("a", 1, seconds=10), succeeded("a"), progress("a", attempt=2))

    assert value(text, "shardyard_recovery_seconds_count") == 0


def test_the_start_estimate_error_is_the_placement_minus_the_last_estimate() -> None:
    def estimate(job_id: str, seconds: float | None, p90: float | None = None) -> JobUnschedulable:
        return JobUnschedulable(
            occurred_at=at(2),
            job_id=job_id,
            reason=PendingReason.INSUFFICIENT_GPUS,
            message="no",
            estimated_start=None if seconds is None else at(seconds),
            estimated_start_p90=None if p90 is None else at(p90),
        )

    text = scrape(
        *ready("early", 5),
        estimate("early", 200),
        estimate("early", 150, p90=300),  # the newest estimate counts
        scheduled("early", occurred_at=at(140)),  # 10 s before it
        *ready("late", 5),
        estimate("late", 100, p90=150),
        scheduled("late", occurred_at=at(160)),  # 60 s after it, 10 s after its p90
        *ready("unknown", 5),
        estimate("unknown", 100),
        estimate("unknown", None),  # no longer known: no error to count
        scheduled("unknown", occurred_at=at(500)),
    )

    assert value(text, "shardyard_start_estimate_error_seconds_count") == 2
    assert value(text, "shardyard_start_estimate_error_seconds_sum") == 70  # 10 early + 60 late
    assert value(text, "shardyard_start_estimate_error_seconds_bucket", le="5.0") == 0
    assert value(text, "shardyard_start_estimate_error_seconds_bucket", le="10.0") == 1
    assert value(text, "shardyard_start_estimate_error_seconds_bucket", le="60.0") == 2
    assert value(text, "shardyard_start_estimates_late") == 1
    assert value(text, "shardyard_start_estimates_after_p90") == 1  # late's; early's came 160 s before its p90


@pytest.mark.parametrize(
    "ends_the_wait",
    [
        pytest.param(scheduled("a", occurred_at=at(95)), id="placed"),
        pytest.param(JobCancelled(occurred_at=at(95), job_id="a", message="by cli"), id="cancelled"),
    ],
)
def test_a_pending_jobs_estimated_starts_are_in_its_detail_and_listing_until_its_wait_ends(
    ends_the_wait: object,
) -> None:
    view = ClusterView()
    for event in ready("a", 5):
        view.apply(event)
    view.apply(
        JobUnschedulable(
            occurred_at=at(2),
            job_id="a",
            reason=PendingReason.INSUFFICIENT_GPUS,
            message="no",
            estimated_start=at(90),
            estimated_start_p90=at(150),
        )
    )
    (listed,) = view.jobs_json()
    for shown in (view.job_detail(view.jobs["a"], at(3)), listed):
        assert (shown["estimated_start"], shown["estimated_start_p90"]) == (at(90).isoformat(), at(150).isoformat())

    view.apply(ends_the_wait)
    (listed,) = view.jobs_json()
    for shown in (view.job_detail(view.jobs["a"], at(96)), listed):
        assert (shown["estimated_start"], shown["estimated_start_p90"]) == (None, None)


# --- the exposition ---------------------------------------------------------------------------------------------
def busy_view() -> ClusterView:
    """A view with every family in use: jobs queued and running, GPUs of several kinds, heartbeats, alerts' figures,
    and label values that need escaping."""
    view = ClusterView(telemetry=Telemetry(clock=FakeClock(at(10.25))))
    hot = GpuStatus(index=3, model="H100", tflops=60.0, memory_bytes=80 * GIB, temperature_c=91.5, healthy=False)
    events: list[object] = [
        *running("a", 5),
        progress("a", 0, step=40, loss=3.5, syncs=2, allreduce_ms=12.5),
        *unschedulable("b", 7, PendingReason.NO_FIT),
        *waiting("c", 0),
        recovering("a", 1, seconds=10),
        node_state("n1", topology={"zone": "z1", "rack": "r1"}),
        node_state("n2", gpus=(hot,), topology={"zone": "z2"}, draining=True),
        node_state('odd"node\\with\nlines', status=NodeStatus.SUSPECT),
        node_state("gone", status=NodeStatus.LOST),
        heartbeat("n1", occurred_at=at(10)),
    ]
    for event in events:
        view.apply(event)
    view.consumer_lag = {"shardyard.nodes.heartbeats": 3, "a \\ topic": 1}
    return view


def test_the_exposition_is_what_prometheus_client_writes() -> None:
    metrics = MonitorMetrics(busy_view())
    metrics.events.labels("shardyard.nodes.state").inc(4)

    assert metrics.exposition().decode() == generate_latest(metrics.registry).decode()


def test_label_values_are_escaped() -> None:
    text = MonitorMetrics(busy_view()).exposition().decode()

    assert 'shardyard_node_cpu_load_ratio{node="odd\\"node\\\\with\\nlines"} 0.1' in text.splitlines()
    assert value(text, "shardyard_node_cpu_load_ratio", node='odd"node\\with\nlines') == pytest.approx(0.1)
    assert value(text, "shardyard_monitor_consumer_lag_messages", topic="a \\ topic") == 1


def test_make_registry_serves_the_same_families() -> None:
    view = busy_view()
    registry, _events = make_registry(view)

    assert generate_latest(registry) == MonitorMetrics(view).exposition()
