"""The listings' rendering: jobs with owner, queue and elapsed time, wide nodes and alerts, the measured links as a
wide table, and ``shardyard status``'s summary of the cluster. Pure: the monitor's JSON in, text out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shardyard.cli import listing, render

NOW = datetime(2026, 1, 1, 2, 0, 0, tzinfo=UTC)


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).isoformat()


def job(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "job_id": "j1",
        "state": "RUNNING",
        "reason": None,
        "message": "",
        "priority": 5,
        "gpus": "2 x A100",
        "attempt": 1,
        "step": 40,
        "max_steps": 300,
        "loss": 3.25,
        "owner": "alice",
        "queue": "default",
        "submitted_at": ago(600),
        "started_at": ago(65),
        "ended_at": None,
    }
    return {**base, **fields}


@pytest.mark.parametrize(
    ("view", "shown"),
    [
        # Since its submission, across attempts: a retry (a later started_at) does not reset it.
        pytest.param(job(), "10m00s", id="running-since-its-submission"),
        pytest.param(job(attempt=3, started_at=ago(5)), "10m00s", id="a-third-attempt-does-not-reset-it"),
        pytest.param(job(state="READY", started_at=None), "10m00s", id="pending-since-submission"),
        pytest.param(job(state="WAITING", started_at=None, submitted_at=ago(7260)), "2h01m", id="waiting"),
        pytest.param(job(state="READY"), "10m00s", id="requeued-after-a-run-counts-its-wait"),
        pytest.param(job(state="SUCCEEDED", ended_at=ago(5)), "9m55s", id="ended-submission-to-end"),
        pytest.param(job(state="CANCELLED", started_at=None, ended_at=ago(5)), "9m55s", id="ended-never-started"),
        pytest.param(job(state="REJECTED", submitted_at=None, started_at=None, ended_at=ago(5)), "-", id="rejected"),
        pytest.param(job(started_at=None), "10m00s", id="running-without-a-start-older-monitor"),
    ],
)
def test_elapsed(view: dict[str, Any], shown: str) -> None:
    assert listing.elapsed(view, NOW) == shown


def test_the_jobs_table_shows_owner_queue_and_elapsed() -> None:
    jobs = [
        job(),
        job(job_id="j2", state="READY", owner=None, queue="research", started_at=None, reason="NO_FIT", message="m"),
    ]

    lines = listing.jobs_table(jobs, NOW).splitlines()

    assert lines[0].split() == ["JOB", "STATE", "OWNER", "QUEUE", "PRIO", "GPUS", "STEP", "LOSS", "ELAPSED", "REASON"]
    assert lines[1].split() == ["j1", "RUNNING", "alice", "default", "5", "2", "x", "A100", "40/300", "3.25", "10m00s"]
    assert lines[2].split()[:4] == ["j2", "READY", "-", "research"]
    assert lines[2].endswith("10m00s   NO_FIT: m")


def test_the_wide_jobs_table_adds_attempt_and_times() -> None:
    lines = listing.jobs_table([job(attempt=2)], NOW, wide=True).splitlines()

    assert lines[0].split()[6:13] == ["ATTEMPT", "STEP", "LOSS", "SUBMITTED", "STARTED", "ELAPSED", "STARTS"]
    assert lines[1].split()[8:15] == [
        "2",
        "40/300",
        "3.25",
        "2026-01-01T01:50:00Z",
        "2026-01-01T01:58:55Z",
        "10m00s",
        "-",  # not waiting
    ]


def test_the_wide_jobs_table_says_when_a_waiting_job_starts() -> None:
    waiting = job(
        state="READY",
        started_at=None,
        reason="INSUFFICIENT_GPUS",
        message="m",
        estimated_start=(NOW + timedelta(minutes=12)).isoformat(),
        estimated_start_p90=(NOW + timedelta(minutes=30)).isoformat(),
    )

    row = listing.jobs_table([waiting], NOW, wide=True).splitlines()[1]

    assert row.endswith("10m00s   ~12m (90%: 30m)  INSUFFICIENT_GPUS: m")


def test_a_job_from_an_older_monitor_without_the_new_fields_still_lists() -> None:
    old = {k: v for k, v in job().items() if k not in ("owner", "queue", "started_at", "ended_at")}

    assert listing.jobs_table([old], NOW).splitlines()[1].split()[2:4] == ["-", "-"]


def node(**fields: Any) -> dict[str, Any]:
    gpu = {
        "model": "A100",
        "tflops": 35.0,
        "simulated": True,
        "utilization": 0.5,
        "memory_bytes": 80 * 1024**3,
        "memory_used_bytes": 20 * 1024**3,
        "temperature_c": 61.0,
    }
    base: dict[str, Any] = {
        "node_id": "n1",
        "status": "ALIVE",
        "draining": False,
        "gpus": [gpu, {**gpu, "utilization": 0.3, "temperature_c": 70.0}],
        "allocated_gpus": [0],
        "cpu_load": 0.25,
        "cpu_cores": 16.0,
        "memory_bytes": 64 * 1024**3,
        "running": [{"job_id": "j1", "shard_index": 0}],
        "output_disk": {"path": "/data/out", "free_bytes": 10 * 1024**3, "total_bytes": 100 * 1024**3},
        "artifact_count": 2,
        "topology": {"zone": "z1", "rack": "r2"},
        "last_heartbeat_at": ago(3),
    }
    return {**base, **fields}


def test_the_nodes_table() -> None:
    lines = listing.nodes_table([node(draining=True)], NOW).splitlines()

    assert lines[0].split() == ["NODE", "STATUS", "GPUS", "IN", "USE", "LOAD", "SHARDS"]
    assert lines[1].split() == ["n1", "ALIVE", "DRAIN", "2xA100", "35TF", "(simulated)", "1/2", "25%", "j1#0"]


def test_the_wide_nodes_table_adds_gpu_use_host_and_last_sign_of_life() -> None:
    lines = listing.nodes_table(
        [node(), node(node_id="n2", gpus=[], allocated_gpus=[], output_disk=None, topology={}, running=[])],
        NOW,
        wide=True,
    )
    header, first, second = lines.splitlines()

    for column in ("GPU UTIL", "GPU MEM", "TEMP", "CPUS", "MEMORY", "DISK FREE", "ARTIFACTS", "TOPOLOGY", "SEEN"):
        assert column in header
    shown = ["40%", "40GiB/160GiB", "70C", "25%", "16", "64GiB", "10GiB/100GiB", "2", "rack=r2,zone=z1", "3s", "ago"]
    assert first.split()[6:] == [*shown, "j1#0"]
    assert second.split()[:9] == ["n2", "ALIVE", "-", "0/0", "-", "-", "-", "25%", "16"]
    assert second.split()[9:] == ["64GiB", "-", "2", "-", "3s", "ago", "-"]


FIRING = {
    "type": "alert.firing",
    "occurred_at": ago(125),
    "rule": "NODE_SUSPECT",
    "subject": "node-1",
    "severity": "WARNING",
    "summary": "node-1 is SUSPECT",
    "value": 3.5,
    "threshold": 0.0,
    "since": ago(125),
}


def test_the_wide_alerts_add_measure_limit_and_start() -> None:
    lines = listing.alerts_table({"firing": [FIRING], "recent": [FIRING]}, NOW, wide=True).splitlines()

    assert lines[1].split() == ["SEVERITY", "RULE", "SUBJECT", "VALUE", "THRESHOLD", "SINCE", "FOR", "SUMMARY"]
    assert lines[2].split()[:7] == ["WARNING", "NODE_SUSPECT", "node-1", "3.5", "0", "2026-01-01T01:57:55Z", "2m05s"]
    assert lines[4:6] == ["recent:", render.alert_history([FIRING]).splitlines()[0]]


def test_the_plain_alerts_are_the_report_they_were() -> None:
    answer = {"firing": [FIRING], "recent": []}
    assert listing.alerts_table(answer, NOW) == render.alerts_report(answer, NOW)


def link(a: str, b: str, rtt_ms: float, *, slow: bool = False) -> dict[str, Any]:
    return {
        "a": a,
        "b": b,
        "source": "measured",
        "rtt_ms": rtt_ms,
        "rtt_p90_ms": rtt_ms * 1.5,
        "bandwidth_bytes_per_s": 1.25e9,
        "measured_at": ago(2),
        "slow": slow,
        "why": "rtt 10x the cluster's median" if slow else "",
    }


def test_the_wide_links_are_every_measured_link_as_a_table_not_a_matrix() -> None:
    answer = {"nodes": ["n1", "n2", "n3"], "links": [link("n1", "n3", 9.0, slow=True), link("n1", "n2", 0.5)]}

    plain, wide = render.links_report(answer), render.links_report(answer, wide=True)

    assert plain.startswith("RTT (ms)")
    lines = wide.splitlines()
    assert lines[0] == "the 2 measured links among 3 live nodes, worst first"
    assert lines[1].split() == ["A", "B", "RTT", "MS", "P90", "MS", "BANDWIDTH", "MEASURED", "SLOW"]
    assert lines[2].split() == ["n1", "n3", "9.00", "13.5", "1250.0", "MB/s", "01:59:58", "*"]
    assert "n1|n3: rtt 10x the cluster's median" in wide


SUMMARY: dict[str, Any] = {
    "jobs": {"ACCEPTED": 0, "READY": 1, "RUNNING": 2, "SUCCEEDED": 4, "FAILED": 1},
    "active_jobs": 3,
    "nodes": {"ALIVE": 3, "SUSPECT": 0, "LOST": 1},
    "draining": 1,
    "gpus": 6,
    "gpus_allocated": 3,
    "gpus_unhealthy": 1,
    "gpu_utilization": 0.42,
    "spare_ratio": 0.25,
    "failure_rate": 0.01,
    "preemptions": 2,
    "recoveries": 1,
    "cancellations": 0,
    "dead_letters": 0,
    "gpu_models": {
        "A100": {"gpus": 4, "allocated": 2, "unhealthy": 1, "free": 1},
        "V100": {"gpus": 2, "allocated": 1, "unhealthy": 0, "free": 1},
    },
    "alerts_firing": {"WARNING": 1, "CRITICAL": 0},
    "leaders": {"scheduler": {"instance": "scheduler-1", "term": 2, "since": "2026-01-01T01:00:00+00:00"}},
}
URL = "http://127.0.0.1:8787"


def test_the_cluster_summary() -> None:
    lines = listing.cluster_summary(SUMMARY, URL).splitlines()

    assert lines == [
        "monitor: http://127.0.0.1:8787",
        "scheduler leader: scheduler-1 (term 2, since 2026-01-01T01:00:00Z)",
        "nodes:   3 ALIVE, 1 LOST; 1 draining",
        "GPUs:    3 of 6 in use, 2 free, 1 faulty",
        "  MODEL  GPUS  IN USE  FREE  FAULTY",
        "  A100   4     2       1     1     ",
        "  V100   2     1       1     0     ",
        "jobs:    1 READY, 2 RUNNING, 4 SUCCEEDED, 1 FAILED (3 active of 8)",
        "alerts:  1 firing: 1 WARNING (`shardyard alerts`)",
    ]


def test_the_wide_summary_adds_utilisation_counters_and_every_leader() -> None:
    summary = {**SUMMARY, "leaders": {**SUMMARY["leaders"], "queue": {"instance": "queue-0", "term": 1}}}

    wide = listing.cluster_summary(summary, URL, wide=True)

    assert wide.startswith(listing.cluster_summary(summary, URL))
    assert "GPU utilisation: 42%" in wide
    assert "preemptions: 2, recoveries: 1, cancellations: 0, dead letters: 0" in wide
    assert "  queue: queue-0 (term 1, since -)" in wide.splitlines()


def test_the_summary_of_an_empty_cluster_and_an_older_monitor() -> None:
    empty = {"jobs": {"RUNNING": 0}, "active_jobs": 0, "nodes": {"ALIVE": 0}, "gpus": 0, "gpus_allocated": 0}

    lines = listing.cluster_summary(empty, URL).splitlines()

    assert lines[1] == "scheduler leader: not known to the monitor (no election seen yet)"
    assert lines[2:5] == ["nodes:   none have reported", "GPUs:    0 of 0 in use", "jobs:    none (0 active of 0)"]
    assert len(lines) == 5  # an older monitor's summary names no alerts: no line rather than a wrong one


def test_the_summary_counts_the_gpus_of_the_nodes_not_lost() -> None:
    """``gpus``/``gpus_allocated`` count a LOST node's GPUs too; the per-model figures, which the line sums, do not."""
    summary = {**SUMMARY, "gpus": 8, "gpus_allocated": 4, "gpu_models": {}}

    lines = listing.cluster_summary(summary, URL).splitlines()

    assert lines[3:5] == [
        "GPUs:    0 of 0 in use, 0 free",
        "jobs:    1 READY, 2 RUNNING, 4 SUCCEEDED, 1 FAILED (3 active of 8)",
    ]
