"""The terminal rendering of jobs and nodes: pending reasons with node counts, degraded placements, drain marks."""

from __future__ import annotations

from typing import Any

import pytest

from shardyard.cli import render


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
    assert line in render.job_detail(view).splitlines()


def test_job_detail_without_node_counts_has_no_count_line() -> None:
    assert "nodes:" not in render.job_detail(job(reason="NO_NODES", message="no nodes have joined", node_counts={}))


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
    table = render.nodes_table([node("n1", draining=True), node("n2")]).splitlines()

    assert table[1].split()[:3] == ["n1", "ALIVE", "DRAIN"]
    assert "DRAIN" not in table[2]


def test_nodes_table_shows_tflops_and_marks_measured_figures() -> None:
    measured = {"model": "V100", "tflops": 14.2, "tflops_source": "measured", "simulated": False}

    table = render.nodes_table([node("n1"), node("n2", gpus=[measured])])

    assert "2xA100 35TF " in table and "1xV100 14.2TF*" in table
