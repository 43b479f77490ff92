"""Elastic jobs in the simulator's inputs and outputs: the trace's ``min_shards``/``max_shards`` columns, the share
of jobs made elastic (``--elastic-share``, at generation or at replay) and the resizes in the report."""

from __future__ import annotations

import argparse
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from shardyard.errors import ConfigError
from shardyard.sim import cli
from shardyard.sim.cluster import parse_cluster
from shardyard.sim.generate import generate, mark_elastic
from shardyard.sim.trace import TraceError, TraceJob, parse_trace, read_trace, trace_text

HEADER = "submit_s,gpus,gpu_model,duration_s,priority,min_shards,max_shards"


def parse(text: str) -> list[TraceJob]:
    return parse_trace(io.StringIO(text), "t.csv")


def simulate_cli(*argv: str) -> int:
    top = argparse.ArgumentParser(prog="shardyard")
    cli.add_parser(top.add_subparsers(dest="command", required=True))
    args = top.parse_args(["simulate", *argv])
    code: int = args.func(args)
    return code


@pytest.mark.parametrize(
    ("row", "sizes"),
    [
        pytest.param("0,4,V100,60,0,2,8", (2, 8), id="range"),
        pytest.param("0,4,V100,60,0,4,4", (4, 4), id="one-size"),
        pytest.param("0,4,V100,60,0,1,4096", (1, 4096), id="limits"),
        pytest.param("0,4,V100,60,0,,", (None, None), id="empty-rigid"),
    ],
)
def test_the_elastic_columns(row: str, sizes: tuple[int | None, int | None]) -> None:
    [job] = parse(f"{HEADER}\n{row}\n")

    assert (job.min_shards, job.max_shards) == sizes


@pytest.mark.parametrize(
    ("row", "column", "problem"),
    [
        pytest.param("0,4,V100,60,0,5,8", "min_shards", r"min_shards \(5\) <= gpus \(4", id="min-above-gpus"),
        pytest.param("0,4,V100,60,0,2,3", "max_shards", r"<= max_shards \(3\) does not hold", id="max-below-gpus"),
        pytest.param("0,4,V100,60,0,0,8", "min_shards", "out of range; must be 1..4096", id="min-zero"),
        pytest.param("0,4,V100,60,0,2,5000", "max_shards", "out of range; must be 1..4096", id="max-too-large"),
        pytest.param("0,4,V100,60,0,2.5,8", "min_shards", "not an integer", id="fraction"),
        pytest.param("0,4,V100,60,0,2,", "min_shards", "set without max_shards", id="min-alone"),
        pytest.param("0,4,V100,60,0,,8", "max_shards", "set without min_shards", id="max-alone"),
    ],
)
def test_a_bad_range_is_refused_naming_the_line(row: str, column: str, problem: str) -> None:
    with pytest.raises(TraceError, match=problem) as caught:
        parse(f"{HEADER}\n0,1,V100,1,0,,\n{row}\n")

    assert (caught.value.line, caught.value.column) == (3, column)


def test_elastic_jobs_round_trip_through_the_csv() -> None:
    nodes = parse_cluster("V100:8x4")
    jobs = mark_elastic(generate(40, 2, nodes), 0.5, nodes)

    assert parse(trace_text(jobs)) == jobs
    assert any(job.min_shards is not None for job in jobs) and any(job.min_shards is None for job in jobs)


def test_the_elastic_share() -> None:
    """The share picks rigid jobs by a hash of their id (about that share, the same ones every time, a smaller
    share a subset of a larger one); an elastic job ranges from half its GPUs to twice them, within the GPUs that
    can host it; the other jobs, and jobs already elastic, are left as they are."""
    nodes = parse_cluster("A100:8x2,V100:8x1")
    rigid = generate(400, 5, nodes, shape="philly")

    marked = mark_elastic(rigid, 0.5, nodes)

    def picked(jobs: list[TraceJob]) -> set[str]:
        return {job.job_id for job in jobs if job.min_shards is not None}

    assert 0.4 < len(picked(marked)) / len(rigid) < 0.6
    assert marked == mark_elastic(rigid, 0.5, nodes)
    assert picked(mark_elastic(rigid, 0.25, nodes)) < picked(marked)
    assert mark_elastic(rigid, 0.0, nodes) == rigid
    for before, after in zip(rigid, marked, strict=True):
        assert replace(after, min_shards=None, max_shards=None) == before
        if after.min_shards is not None:
            room = {"A100": 16, "V100": 8, None: 24}[after.gpu_model]
            assert after.min_shards == max(1, after.gpus // 2)
            assert after.max_shards == max(after.gpus, min(2 * after.gpus, room))
    again = mark_elastic(marked, 1.0, nodes)
    assert [job for job in again if job.job_id in picked(marked)] == [
        job for job in marked if job.job_id in picked(marked)
    ]


def test_a_trace_generated_elastic_is_the_rigid_one_replayed_elastic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rigid, flexible = tmp_path / "rigid.csv", tmp_path / "elastic.csv"
    common = ("--generate", "60", "--seed", "3", "--cluster", "V100:8x4")
    assert simulate_cli(*common, "--out", str(rigid)) == 0
    assert simulate_cli(*common, "--elastic-share", "0.5", "--out", str(flexible)) == 0
    nodes = parse_cluster("V100:8x4")
    assert read_trace(flexible) == mark_elastic(read_trace(rigid), 0.5, nodes)
    capsys.readouterr()

    args = ("--cluster", "V100:8x4", "--policy", "shardyard", "--policy", "fifo", "--json")
    assert simulate_cli(str(rigid), *args, "--elastic-share", "0.5") == 0
    replayed = json.loads(capsys.readouterr().out)
    assert simulate_cli(str(flexible), *args) == 0
    generated = json.loads(capsys.readouterr().out)

    assert replayed["policies"] == generated["policies"]
    assert replayed["elastic_jobs"] == generated["elastic_jobs"] > 0
    assert replayed["policies"]["shardyard"]["resizes"] > 0 == replayed["policies"]["fifo"]["resizes"]
    assert generated["resize_s"] == 5.0


def test_the_table_gives_the_resizes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(f"{HEADER}\n0,4,V100,1000,0,2,16\n")

    assert simulate_cli(str(trace), "--cluster", "V100:8x2", "--policy", "shardyard", "--resize-s", "20") == 0

    lines = capsys.readouterr().out.splitlines()
    assert "RESIZES" in lines[-4].split()
    row = lines[-3].split()
    assert row[0] == "shardyard" and row[row.index("100.0%") + 1] == "1"  # all 16 GPUs, 20 + 250 s
    assert "elastic:  1 jobs; each resize holds the gang 20 s without progress" in lines


@pytest.mark.parametrize("share", ["1.5", "-0.1", "nan"])
def test_a_share_out_of_range_is_refused(share: str) -> None:
    with pytest.raises(ConfigError, match="--elastic-share"):
        simulate_cli("--generate", "3", "--elastic-share", share)
