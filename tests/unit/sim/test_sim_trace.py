"""The simulator's inputs: the CSV trace (strict, errors name line and column) and the cluster declaration."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from shardyard.errors import ConfigError, ShardyardError
from shardyard.gpus import catalogue_with
from shardyard.sim.cluster import NodeSpec, describe, parse_cluster
from shardyard.sim.trace import TraceError, TraceJob, parse_trace, read_trace

HEADER = "submit_s,gpus,gpu_model,duration_s,priority"


def parse(text: str) -> list[TraceJob]:
    return parse_trace(io.StringIO(text), "t.csv")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            f"{HEADER}\n0,2,A100,60,5\n",
            TraceJob("job-1", 0.0, 2, "A100", 60.0, 5, 35.0),
            id="required-columns-catalogue-tflops",
        ),
        pytest.param(f"{HEADER}\n1.5,1,ANY,10,0\n", TraceJob("job-1", 1.5, 1, None, 10.0, 0, 0.0), id="any"),
        pytest.param(f"{HEADER}\n0,1,,10,0\n", TraceJob("job-1", 0.0, 1, None, 10.0, 0, 0.0), id="empty-model-any"),
        pytest.param(
            f"{HEADER}\n0,64,nvidia h100,0.5,1000\n", TraceJob("job-1", 0.0, 64, "H100", 0.5, 1000, 67.0), id="limits"
        ),
        pytest.param(
            "priority,duration_s,gpu_model,gpus,submit_s,job_id,min_tflops\n3, 20 ,V100,4,7,train-a,12.5\n",
            TraceJob("train-a", 7.0, 4, "V100", 20.0, 3, 12.5),
            id="any-order-optional-columns",
        ),
        pytest.param(
            f"{HEADER},min_match,max_wait_s\n0,2,A100,60,0,0.4,900\n",
            TraceJob("job-1", 0.0, 2, "A100", 60.0, 0, 35.0, 0.4, 900.0),
            id="degraded-opt-in",
        ),
        pytest.param(
            f"{HEADER},min_match,max_wait_s\n0,2,A100,60,0,,\n",
            TraceJob("job-1", 0.0, 2, "A100", 60.0, 0, 35.0),
            id="empty-optional-cells",
        ),
    ],
)
def test_good_row(text: str, expected: TraceJob) -> None:
    assert parse(text) == [expected]


def test_default_ids_count_data_rows_and_blank_lines_are_skipped() -> None:
    jobs = parse(f"{HEADER},job_id\n0,1,A100,1,0,\n\n0,1,A100,1,0,named\n0,1,A100,1,0,\n")

    assert [job.job_id for job in jobs] == ["job-1", "named", "job-3"]


@pytest.mark.parametrize(
    ("text", "line", "column", "problem"),
    [
        pytest.param("", 1, None, "the trace is empty", id="empty-file"),
        pytest.param(f"{HEADER}\n", 1, None, "the trace has no jobs", id="header-only"),
        pytest.param("submit_s,gpus,gpu_model,priority\n", 1, "duration_s", "required column missing", id="missing"),
        pytest.param(f"{HEADER},colour\n", 1, "colour", "unknown column", id="unknown-column"),
        pytest.param(f"{HEADER},gpus\n", 1, "gpus", "appears twice", id="duplicate-column"),
        pytest.param(f"{HEADER}\n0,1,A100,1\n", 2, None, "has 4 fields; the header has 5", id="short-row"),
        pytest.param(f"{HEADER}\n0,1,A100,1,0\nsoon,1,A100,1,0\n", 3, "submit_s", "'soon' is not a number", id="nan"),
        pytest.param(f"{HEADER}\n-1,1,A100,1,0\n", 2, "submit_s", "out of range; must be at least 0", id="negative"),
        pytest.param(f"{HEADER}\ninf,1,A100,1,0\n", 2, "submit_s", "out of range", id="infinite"),
        pytest.param(f"{HEADER}\n,1,A100,1,0\n", 2, "submit_s", "is empty; a number is required", id="empty-submit"),
        pytest.param(f"{HEADER}\n0,0,A100,1,0\n", 2, "gpus", "'0' is out of range; must be 1..64", id="zero-gpus"),
        pytest.param(f"{HEADER}\n0,65,A100,1,0\n", 2, "gpus", "must be 1..64", id="too-many-gpus"),
        pytest.param(f"{HEADER}\n0,2.5,A100,1,0\n", 2, "gpus", "'2.5' is a fractional GPU", id="fractional-gpus"),
        pytest.param(f"{HEADER}\n0,1,B300,1,0\n", 2, "gpu_model", "unknown GPU model 'B300'", id="unknown-model"),
        pytest.param(f"{HEADER}\n0,1,A100,0,0\n", 2, "duration_s", "must be above 0", id="zero-duration"),
        pytest.param(f"{HEADER}\n0,1,A100,1,1001\n", 2, "priority", "must be 0..1000", id="priority-high"),
        pytest.param(f"{HEADER}\n0,1,A100,1,-1\n", 2, "priority", "must be 0..1000", id="priority-negative"),
        pytest.param(f"{HEADER}\n0,1,A100,1,high\n", 2, "priority", "'high' is not an integer", id="priority-text"),
        pytest.param(f"{HEADER},min_tflops\n0,1,A100,1,0,-3\n", 2, "min_tflops", "at least 0", id="tflops-negative"),
        pytest.param(f"{HEADER},min_match\n0,1,A100,1,0,0\n", 2, "min_match", "above 0 and at most 1", id="match-0"),
        pytest.param(f"{HEADER},min_match\n0,1,A100,1,0,1.5\n", 2, "min_match", "at most 1", id="match-over-1"),
        pytest.param(f"{HEADER},max_wait_s\n0,1,A100,1,0,60\n", 2, "max_wait_s", "without min_match", id="wait-alone"),
        pytest.param(
            f"{HEADER},job_id\n0,1,A100,1,0,a\n0,1,A100,1,0,a\n", 3, "job_id", "'a' already used on line 2", id="dup-id"
        ),
        pytest.param(
            f"{HEADER},job_id\n0,1,A100,1,0,job-2\n0,1,A100,1,0,\n",
            3,
            "job_id",
            "'job-2' already used",
            id="dup-default",
        ),
    ],
)
def test_bad_row(text: str, line: int, column: str | None, problem: str) -> None:
    with pytest.raises(TraceError) as caught:
        parse(text)

    error = caught.value
    assert (error.line, error.column) == (line, column)
    assert problem in error.problem
    assert str(error).startswith(f"t.csv:{line}" + (f": column {column!r}" if column else ""))
    assert isinstance(error, ShardyardError)


def test_a_line_number_counts_physical_lines() -> None:
    text = f'{HEADER},job_id\n0,1,A100,1,0,"two\nlines"\n0,1,A100,x,0,b\n'

    with pytest.raises(TraceError) as caught:
        parse(text)

    assert (caught.value.line, caught.value.column) == (4, "duration_s")


def test_a_catalogue_override_adds_a_model_and_its_default_floor() -> None:
    jobs = parse_trace(io.StringIO(f"{HEADER}\n0,8,MI300X,1,0\n"), catalogue=catalogue_with(["MI300X=163"]))

    assert (jobs[0].gpu_model, jobs[0].min_tflops) == ("MI300X", 163.0)


def test_an_unreadable_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read the trace"):
        read_trace(tmp_path / "absent.csv")


# --- the cluster declaration ----------------------------------------------------------------------------------------
def test_cluster_groups_become_numbered_nodes() -> None:
    nodes = parse_cluster("A100:8x2, v100 : 4X1,A100:2x1")

    assert nodes == (
        NodeSpec("a100-000", "A100", 35.0, 8),
        NodeSpec("a100-001", "A100", 35.0, 8),
        NodeSpec("v100-000", "V100", 15.0, 4),
        NodeSpec("a100-002", "A100", 35.0, 2),
    )
    assert describe(nodes) == "4 nodes, 22 GPUs (A100 18, V100 4)"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param("", "empty cluster declaration", id="empty"),
        pytest.param("A100", "group 1 'A100' is not MODEL:GPUSxNODES", id="no-shape"),
        pytest.param("A100:8", "is not MODEL:GPUSxNODES", id="no-node-count"),
        pytest.param("A100:8x2,,V100:8x1", "group 2 '' is not MODEL:GPUSxNODES", id="empty-group"),
        pytest.param("A100:8x2;V100:8x1", "is not MODEL:GPUSxNODES", id="wrong-separator"),
        pytest.param("A100:-8x2", "is not MODEL:GPUSxNODES", id="negative"),
        pytest.param("B300:8x2", "unknown GPU model 'B300'", id="unknown-model"),
        pytest.param("A100:0x2", "GPUs per node must be 1..64", id="zero-gpus"),
        pytest.param("A100:65x2", "GPUs per node must be 1..64", id="too-many-gpus"),
        pytest.param("A100:8x0", "node count must be at least 1", id="zero-nodes"),
        pytest.param("A100:8x10001", "more than 10000 nodes", id="too-many-nodes"),
    ],
)
def test_bad_cluster(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_cluster(text)


def test_cluster_with_a_catalogue_override() -> None:
    (node,) = parse_cluster("MI300X:8x1", catalogue_with(["MI300X=163"]))

    assert (node.node_id, node.tflops) == ("mi300x-000", 163.0)
