"""The terminal rendering of jobs and nodes: pending reasons with node counts, degraded placements, drain marks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shardyard.cli import listing, render


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        pytest.param(
            {"load above 50%": 5, "GPU model mismatch": 25, "insufficient free GPUs": 10},
            "0/40 nodes: 25 GPU model mismatch, 10 insufficient free GPUs, 5 load above 50%",
            id="most-first",
        ),
        pytest.param({"b": 2, "a": 2, "c": 3}, "0/7 nodes: 3 c, 2 a, 2 b", id="ties-by-name"),
        pytest.param({"no free GPU": 1}, "0/1 nodes: 1 no free GPU", id="one-filter"),
    ],
)
def test_excluded_nodes(counts: dict[str, int], expected: str) -> None:
    assert render.excluded_nodes(counts) == expected


def job(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"job_id": "j", "state": "READY", "reason": None, "message": ""}
    return {**base, **fields}


def placement(index: int, *, score: float = 1.0, degraded: bool = False) -> dict[str, Any]:
    return {
        "shard_index": index,
        "node_id": f"n{index}",
        "gpu_indices": [0],
        "gpu_model": "V100" if degraded else "A100",
        "match_score": score,
        "degraded": degraded,
    }


@pytest.mark.parametrize(
    ("view", "line"),
    [
        pytest.param(
            job(reason="NO_FIT", message="no fit", node_counts={"GPU model mismatch": 2, "no free GPU": 1}),
            "    0/3 nodes: 2 GPU model mismatch, 1 no free GPU",
            id="node-counts",
        ),
        pytest.param(
            job(state="WAITING", reason="WAITING_FOR_DEPENDENCY", message="m", waiting_for=["a", "b"]),
            "    waiting for: a, b",
            id="waiting-for",
        ),
        pytest.param(
            job(state="SCHEDULED", placements=[placement(0), placement(1, score=0.4286, degraded=True)], degraded=True),
            "  shard 1 placed on n1 GPU 0 (V100) degraded (match 0.43)",
            id="degraded-placement",
        ),
        pytest.param(
            job(state="SCHEDULED", placements=[placement(0)], degraded=True),
            "  placed degraded: below a full GPU match, as the job allowed",
            id="degraded-job",
        ),
        pytest.param(
            job(state="SCHEDULED", placements=[placement(0)]), "  shard 0 placed on n0 GPU 0 (A100)", id="full-match"
        ),
        pytest.param(
            job(state="CANCELLED", reason="CANCELLED", message="by cli"), "  reason: CANCELLED: by cli", id="c"
        ),
        pytest.param(job(resume_from="/ckpt/step-9"), "  resumed from /ckpt/step-9", id="resumed"),
    ],
)
def test_job_detail_lines(view: dict[str, Any], line: str) -> None:
    assert line in render.job_detail(view, NOW).splitlines()


def test_job_detail_without_node_counts_has_no_count_line() -> None:
    no_nodes = job(reason="NO_NODES", message="no nodes have joined", node_counts={})
    assert "nodes:" not in render.job_detail(no_nodes, NOW)


def test_a_job_waiting_on_capacity_says_when_it_starts_under_its_reason() -> None:
    waiting = job(
        reason="INSUFFICIENT_GPUS",
        message="1/2 GPUs free",
        estimated_start=(NOW + timedelta(minutes=12)).isoformat(),
        estimated_start_p90=(NOW + timedelta(minutes=30)).isoformat(),
    )

    lines = render.job_detail(waiting, NOW).splitlines()

    assert lines[1:3] == ["  reason: INSUFFICIENT_GPUS: 1/2 GPUs free", "    starts in ~12 min, 90 %: within 30 min"]
    assert not any("starts in" in line for line in render.job_detail(job(), NOW).splitlines())


def test_timeline_shows_preemption_and_cancellation() -> None:
    entries = [
        {"at": "2026-01-01T00:00:00+00:00", "event": "preempting", "detail": "attempt 1 yields to vip"},
        {"at": "2026-01-01T00:00:02+00:00", "event": "preempted", "detail": "attempt 1 stopped for vip"},
        {"at": "2026-01-01T00:00:05+00:00", "event": "cancelled", "detail": "cancelled by cli:alice"},
    ]

    lines = render.timeline({"timeline": entries}).splitlines()

    assert [line.split()[2] for line in lines] == ["preempting", "preempted", "cancelled"]
    assert lines[2] == "  +   5.00s  cancelled          cancelled by cli:alice"


def node(node_id: str, **fields: Any) -> dict[str, Any]:
    gpu = {"model": "A100", "tflops": 35.0, "tflops_source": "catalogue", "simulated": False}
    base: dict[str, Any] = {
        "node_id": node_id,
        "status": "ALIVE",
        "draining": False,
        "gpus": [gpu, gpu],
        "allocated_gpus": [0],
        "cpu_load": 0.25,
        "running": [],
    }
    return {**base, **fields}


def test_nodes_table_marks_drained_nodes() -> None:
    table = listing.nodes_table([node("n1", draining=True), node("n2")], NOW).splitlines()

    assert table[1].split()[:3] == ["n1", "ALIVE", "DRAIN"]
    assert "DRAIN" not in table[2]


def test_nodes_table_shows_tflops_and_marks_measured_figures() -> None:
    measured = {"model": "V100", "tflops": 14.2, "tflops_source": "measured", "simulated": False}

    table = listing.nodes_table([node("n1"), node("n2", gpus=[measured])], NOW)

    assert "2xA100 35TF " in table and "1xV100 14.2TF*" in table


# --- alerts, top, logs -------------------------------------------------------------------------------------------
NOW = datetime(2026, 1, 1, 0, 2, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        pytest.param(0, "0s", id="zero"),
        pytest.param(59.9, "59s", id="seconds"),
        pytest.param(125, "2m05s", id="minutes"),
        pytest.param(7260, "2h01m", id="hours"),
        pytest.param(-3, "0s", id="clock-skew"),
    ],
)
def test_duration(seconds: float, text: str) -> None:
    assert render.duration(seconds) == text


def alert(kind: str = "alert.firing", **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "type": kind,
        "occurred_at": "2026-01-01T00:01:00+00:00",
        "rule": "GPU_OVER_TEMPERATURE",
        "subject": "n1/gpu0",
        "severity": "WARNING",
        "summary": "n1 GPU 0 (A100) at 91 C, above 85 C",
        "since": "2026-01-01T00:00:00+00:00",
    }
    return {**base, **fields}


def test_firing_table_says_for_how_long() -> None:
    lines = render.firing_table([alert(), alert(rule="NODE_LOST", subject="n2", severity="CRITICAL")], NOW)

    assert lines.splitlines()[0].split() == ["SEVERITY", "RULE", "SUBJECT", "FOR", "SUMMARY"]
    assert lines.splitlines()[1].split()[:4] == ["WARNING", "GPU_OVER_TEMPERATURE", "n1/gpu0", "2m05s"]
    assert lines.splitlines()[2].split()[:3] == ["CRITICAL", "NODE_LOST", "n2"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(render.firing_table([], NOW), "  (no alerts firing)", id="none-firing"),
        pytest.param(render.alert_history([]), "  (no alerts yet)", id="no-history"),
    ],
)
def test_empty_alert_tables_say_so(text: str, expected: str) -> None:
    assert text == expected


def test_alert_history_marks_firing_and_resolved() -> None:
    history = render.alert_history([alert("alert.resolved", occurred_at="2026-01-01T00:01:30+00:00"), alert()])

    assert [line.split()[:2] for line in history.splitlines()[1:]] == [["00:01:30", "RESOLVED"], ["00:01:00", "FIRING"]]


def test_alerts_report_has_both_parts() -> None:
    report = render.alerts_report({"firing": [alert()], "recent": [alert()]}, NOW).splitlines()

    assert (report[0], report[3], report[4]) == ("firing (1):", "", "recent:")


def top_job(job_id: str, state: str, submitted: str | None = None) -> dict[str, Any]:
    fields = {"step": 1, "max_steps": 10, "loss": None, "reason": None, "message": "", "submitted_at": submitted}
    return {"job_id": job_id, "state": state, **fields}


def test_top_frame() -> None:
    hot = {"model": "A100", "tflops": 35.0, "utilization": 1.0, "temperature_c": 88.0}
    cool = {"model": "A100", "tflops": 35.0, "utilization": 0.0, "temperature_c": 60.0}
    jobs = [
        top_job("done", "SUCCEEDED", "2026-01-01T00:00:09+00:00"),
        top_job("old", "RUNNING", "2026-01-01T00:00:01+00:00"),
        top_job("new", "READY", "2026-01-01T00:00:05+00:00"),
    ]

    frame = render.top([node("n1", gpus=[hot, cool]), node("n2", status="LOST")], jobs, [alert()], NOW)

    lines = frame.splitlines()
    assert lines[0] == ("shardyard top  2026-01-01 00:02:05 UTC  nodes 1/2 alive  jobs 1 running / 3  alerts 1 firing")
    assert lines[3].split() == ["n1", "ALIVE", "2xA100", "35TF", "1/2", "50%", "25%", "88C"]
    assert lines[4].split()[-1] == "-"  # no temperature reported
    assert [line.split()[0] for line in lines[7:10]] == ["new", "old", "done"]  # active first, newest first
    assert "GPU_OVER_TEMPERATURE" in lines[-1]


def test_top_frame_of_an_empty_cluster_and_a_long_job_list() -> None:
    jobs = [top_job(f"j{i}", "READY") for i in range(5)]

    frame = render.top([], jobs, [], NOW, max_jobs=3)

    assert "  (no nodes have reported)" in frame
    assert "  ... 2 more (shardyard jobs)" in frame
    assert frame.endswith("  (no alerts firing)")


@pytest.mark.parametrize(
    ("prefixed", "expected"),
    [pytest.param(True, "[shard 1 attempt 2] step 5", id="several-logs"), pytest.param(False, "step 5", id="one")],
)
def test_log_line(prefixed: bool, expected: str) -> None:
    assert render.log_line(1, 2, "step 5", prefixed=prefixed) == expected
