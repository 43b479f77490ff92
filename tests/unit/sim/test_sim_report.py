"""The generator, the report and the ``simulate`` subcommand: seeded, deterministic, round-tripping."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from shardyard.errors import ConfigError
from shardyard.sim import cli
from shardyard.sim.cluster import parse_cluster
from shardyard.sim.defaults import ONE_QUEUE
from shardyard.sim.engine import simulate
from shardyard.sim.generate import generate
from shardyard.sim.policies import POLICY_NAMES, policy_named
from shardyard.sim.report import Summary, as_json, percentile, summarize, verdict
from shardyard.sim.trace import TraceError, parse_trace, trace_text

CLUSTER = "A100:8x4,V100:8x4,H100:8x2"


def simulate_cli(*argv: str) -> int:
    top = argparse.ArgumentParser(prog="shardyard")
    cli.add_parser(top.add_subparsers(dest="command", required=True))
    args = top.parse_args(["simulate", *argv])
    code: int = args.func(args)
    return code


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        pytest.param([], 99, 0.0, id="none"),
        pytest.param([5.0], 99, 5.0, id="one"),
        pytest.param([float(v) for v in range(1, 101)], 99, 99.0, id="hundred"),
        pytest.param([float(v) for v in range(1, 101)], 50, 50.0, id="median"),
        pytest.param([3.0, 1.0, 2.0], 99, 3.0, id="few-is-the-max"),
    ],
)
def test_nearest_rank_percentile(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == expected


def test_generated_trace_round_trips_through_the_csv() -> None:
    jobs = generate(300, 3, parse_cluster(CLUSTER))

    assert parse_trace(io.StringIO(trace_text(jobs))) == jobs


def test_the_generator_is_seeded() -> None:
    nodes = parse_cluster(CLUSTER)

    assert generate(200, 11, nodes) == generate(200, 11, nodes)
    assert generate(200, 11, nodes) != generate(200, 12, nodes)


def test_the_generated_mix() -> None:
    jobs = generate(2000, 5, parse_cluster(CLUSTER))

    sizes = Counter(job.gpus for job in jobs)
    models = Counter(job.gpu_model for job in jobs)
    priorities = Counter(job.priority for job in jobs)
    assert set(sizes) <= {1, 2, 4, 8, 16} and sizes[1] > sizes[2] > sizes[4] > sizes[16]
    assert set(models) == {"A100", "V100", "H100", None}
    assert priorities[0] > 0.6 * len(jobs) and 0 < priorities[900] < priorities[500] < priorities[100]
    assert all(60 <= job.duration_s <= 6 * 3600 for job in jobs)
    assert [job.submit_s for job in jobs] == sorted(job.submit_s for job in jobs)
    assert any(job.min_match is not None for job in jobs)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_same_seed_same_report(name: str) -> None:
    nodes = parse_cluster(CLUSTER)

    def once() -> Summary:
        trace = generate(150, 9, nodes, load=1.2)
        return summarize(simulate(trace, nodes, policy_named(name, nodes), name=name))

    assert once() == once()


def test_simulate_prints_every_policy_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    assert simulate_cli("--generate", "120", "--seed", "4", "--cluster", CLUSTER, "--out", str(trace)) == 0
    capsys.readouterr()

    assert simulate_cli(str(trace), "--cluster", CLUSTER, "--json") == 0

    report = json.loads(capsys.readouterr().out)
    assert (report["jobs"], report["nodes"], report["gpus"]) == (120, 10, 80)
    assert list(report["policies"]) == [name for name in POLICY_NAMES if name != ONE_QUEUE]  # it needs a queues file
    assert all(figures["completed"] == 120 for figures in report["policies"].values())


def test_simulate_prints_a_table_of_the_chosen_policies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("submit_s,gpus,gpu_model,duration_s,priority\n0,2,A100,60,0\n")

    assert simulate_cli(str(trace), "--cluster", "A100:4x1", "--policy", "fifo", "--policy", "shardyard") == 0

    lines = capsys.readouterr().out.splitlines()
    assert lines[-5].split()[:3] == ["POLICY", "DONE", "AVG"]
    assert [line.split()[:3] for line in lines[-4:-2]] == [["fifo", "1/1", "60.0"], ["shardyard", "1/1", "60.0"]]
    assert lines[-2:] == ["", "verdict: shardyard matched the mean JCT of fifo; mean wait 0.0 s vs 0.0 s (fifo)"]


def figures(policy: str, jct: float, wait: float, completed: int = 10, jobs: int = 10) -> Summary:
    """A made-up summary: ``jct`` and ``wait`` the means (and every percentile)."""
    return Summary(
        policy, jobs, completed, jobs - completed, jct, jct, jct, jct, wait, wait, wait, wait, 1000.0, 0.5, 0, 0,
        lost_gpu_h_preemption=0.0, lost_gpu_h_stopping=0.0, lost_gpu_h_restart=0.0, lost_gpu_h_recomputed=0.0,
        ettr=0.5,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("summaries", "expected"),
    [
        pytest.param(
            [figures("shardyard", 100, 4.9), figures("fifo", 180, 15852.4), figures("priority", 120, 30)],
            "verdict: shardyard cut the mean JCT 1.8x against fifo and 1.2x against priority;"
            " mean wait 4.9 s vs 15,852 s (fifo), 30.0 s (priority)",
            id="better",
        ),
        pytest.param(
            [figures("shardyard", 130, 50), figures("sjf-oracle", 100, 20)],
            "verdict: shardyard was worse than sjf-oracle: mean JCT 1.3x higher; mean wait 50.0 s vs 20.0 s"
            " (sjf-oracle: lower)",
            id="worse",
        ),
        pytest.param(
            [figures("shardyard", 100, 5), figures("fifo", 100, 5)],
            "verdict: shardyard matched the mean JCT of fifo; mean wait 5.0 s vs 5.0 s (fifo)",
            id="equal",
        ),
        pytest.param(
            [
                figures("fifo", 300, 200),
                figures("shardyard", 103, 5),
                figures("priority", 100, 1),
                figures("first-fit", 103.2, 6),
            ],
            "verdict: shardyard cut the mean JCT 2.9x against fifo; it was worse than priority: mean JCT 1.03x"
            " higher; it matched the mean JCT of first-fit; mean wait 5.0 s vs 200 s (fifo), 1.0 s (priority: lower),"
            " 6.0 s (first-fit)",
            id="mixed",
        ),
        pytest.param(
            [figures("shardyard", 100, 5, completed=8), figures("fifo", 150, 9)],
            "verdict: shardyard cut the mean JCT 1.5x against fifo; mean wait 5.0 s vs 9.0 s (fifo);"
            " unfinished jobs: 2 (shardyard), 0 (fifo)",
            id="unfinished",
        ),
        pytest.param(
            [figures("fifo", 100, 5), figures("priority", 90, 5)],
            "verdict: none: the shardyard policy was not run (add --policy shardyard to compare it)",
            id="no-shardyard",
        ),
        pytest.param(
            [figures("shardyard", 100, 5)],
            "verdict: none: no other policy was run to compare shardyard with",
            id="alone",
        ),
    ],
)
def test_the_verdict(summaries: list[Summary], expected: str) -> None:
    assert verdict(summaries) == expected
    assert as_json(summaries, trace="t.csv")["verdict"] == expected


def run_cli(*argv: str, block: str | None = None) -> subprocess.CompletedProcess[str]:
    """``shardyard ARGV`` in a fresh interpreter (``block``: a module it cannot import)."""
    code = "import sys\nfrom shardyard.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
    if block:
        code = f"import sys\nsys.modules[{block!r}] = None\n" + code
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, check=False)


def test_simulate_plots_the_replays_and_ends_with_a_verdict(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(trace_text(generate(60, 4, parse_cluster(CLUSTER), load=1.2)))
    out = tmp_path / "new" / "plots"  # created, parents and all
    policies = ("--policy", "shardyard", "--policy", "fifo", "--policy", "priority")
    command = ["simulate", str(trace), "--cluster", CLUSTER, *policies, "--plot", str(out)]

    ran = subprocess.run(
        [sys.executable, "-m", "shardyard.cli.main", *command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert ran.returncode == 0, ran.stderr
    pictures = [out / name for name in ("jct_cdf.png", "wait_cdf.png", "gpus_busy.png")]
    for picture in pictures:
        data = picture.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, picture
        assert str(picture) in ran.stdout
    lines = ran.stdout.splitlines()
    assert lines[-1].startswith("verdict: shardyard ") and lines[-2] == "", lines[-2:]
    assert (
        "mean JCT" in lines[-1] and "mean wait" in lines[-1] and "(fifo), " in lines[-1] and "(priority)" in lines[-1]
    )
    assert [line.split()[0] for line in lines[-6:-2]] == ["POLICY", "shardyard", "fifo", "priority"]

    as_json_out = run_cli("simulate", str(trace), "--cluster", CLUSTER, *policies, "--json", "--plot", str(out))
    assert as_json_out.returncode == 0, as_json_out.stderr
    report = json.loads(as_json_out.stdout)
    assert report["verdict"] == lines[-1]
    assert report["plots"] == [str(picture) for picture in pictures]


def test_simulate_without_matplotlib_says_what_to_install(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("submit_s,gpus,gpu_model,duration_s,priority\n0,2,A100,60,0\n")

    ran = run_cli(
        "simulate", str(trace), "--cluster", "A100:4x1", "--plot", str(tmp_path / "plots"), block="matplotlib"
    )

    assert ran.returncode == 2
    assert ran.stdout == ""
    (line,) = ran.stderr.strip().splitlines()
    assert line.startswith("error: --plot needs matplotlib") and "pip install 'shardyard[plot]'" in line, line
    assert not (tmp_path / "plots").exists()


def test_simulate_loads_matplotlib_only_to_plot(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("submit_s,gpus,gpu_model,duration_s,priority\n0,2,A100,60,0\n")

    ran = run_cli("simulate", str(trace), "--cluster", "A100:4x1", block="matplotlib")  # importing it would fail

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1].startswith("verdict: shardyard ")


def test_generate_writes_to_standard_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate_cli("--generate", "5", "--cluster", CLUSTER) == 0

    assert len(parse_trace(io.StringIO(capsys.readouterr().out))) == 5


@pytest.mark.parametrize(
    ("argv", "error", "problem"),
    [
        pytest.param((), ConfigError, "needs a TRACE.csv", id="no-trace"),
        pytest.param(("t.csv", "--generate", "3"), ConfigError, "not both", id="trace-and-generate"),
        pytest.param(("--generate", "0"), ConfigError, "at least one job", id="generate-zero"),
        pytest.param(("--generate", "3", "--load", "0"), ConfigError, "load must be above 0", id="zero-load"),
        pytest.param(("t.csv", "--cluster", "A100"), ConfigError, "MODEL:GPUSxNODES", id="bad-cluster"),
        pytest.param(("t.csv", "--gpu-tflops", "MI300X"), ConfigError, "MODEL=TFLOPS", id="bad-override"),
        pytest.param(("absent.csv",), TraceError, "cannot read the trace", id="absent-trace"),
    ],
)
def test_usage_errors(argv: tuple[str, ...], error: type[Exception], problem: str) -> None:
    with pytest.raises(error, match=problem):
        simulate_cli(*argv)
