"""No benchmark rots: every bench in ``bench/`` runs in its smoke mode (``--smoke``: tiny sizes, seconds, the same
code paths, the same JSON; see ``bench/smoke.py``), and a bench added without one fails here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.broker]

ROOT = Path(__file__).parents[2]
BENCH = ROOT / "bench"
ENTRY_POINT = 'if __name__ == "__main__":'

PENDING: set[str] = set()
"""Benches whose smoke mode another change adds. Remove a name once its smoke test is here; the rule then holds for it
too."""
STARTED_BY = {"scale_nodes.py": "scale.py"}
"""Scripts with an entry point that are not benches but worker processes of one (its smoke runs them)."""


@dataclass(frozen=True)
class Smoke:
    script: str
    check: Callable[[dict[str, Any]], None]
    """Asserts on the printed JSON: the keys a real run prints, with values that say the run did its work."""
    timeout_s: float = 180.0
    """Far above the run's time on a loaded 2-core host: a bench that hangs fails its test, it does not hold CI."""


def check_training(out: dict[str, Any]) -> None:
    assert out["bench"] == "training"
    throughput = out["throughput"]
    assert set(throughput["median_steps_per_s"]) == {"torchrun_quiet", "torchrun", "shardyard"}
    assert all(rate > 0 for rate in throughput["median_steps_per_s"].values())
    assert throughput["ratio"] > 0 and len(throughput["paired_ratios"]) == len(throughput["runs"]["shardyard"])
    results = out["bandwidth"]["results"]
    assert results[0]["params"] == "demo model"
    assert all(r["param_sync_gb_per_s"] > 0 and r["raw_gb_per_s"] > 0 and "ratio" in r for r in results)


def check_skeleton(out: dict[str, Any]) -> None:
    assert out["benchmark"] == "skeleton" and out["runs"] == 1
    results = out["results"]
    for key in ("up_to_ready_s", "submit_to_scheduled_s", "submit_to_first_step_s", "job_wall_s", "demo_wall_s"):
        assert set(results[key]) == {"median", "min", "max"}, key
    assert 0 < results["submit_to_scheduled_s"]["median"] <= results["submit_to_first_step_s"]["median"]


def check_recovery(out: dict[str, Any]) -> None:
    assert out["bench"] == "recovery"
    failover = out["scheduler_failover"]
    assert failover["median_assignment_s"] > 0
    old_term, new_term = failover["runs"][0]["terms"]
    assert new_term > old_term
    for scenario, spares in (("spare", 1), ("no_spare", 0)):
        run = out[scenario]["runs"][0]
        assert run["spares_placed"] == spares, (scenario, run)
        assert out[scenario]["median_detection_s"] > 0 and out[scenario]["median_resumed_s"] > 0
        assert run["attempt"] >= 2 and run["steps_lost"] >= 0, (scenario, run)


def check_placement(out: dict[str, Any]) -> None:
    assert out["bench"] == "placement"
    assert set(out["sizes"]) == {"20", "50"}
    for size in out["sizes"].values():
        assert size["decisions"] == out["jobs"] and size["placed_jobs"] > 0
        assert size["decisions_per_s"] > 0 and set(size["latency_ms"]) == {"p50", "p99", "max"}
    assert {"head_p50_growth_pct", "head_mean_growth_pct", "paired_head_mean_growth_pct"} <= set(out["growth"])


def check_schedule_quality(out: dict[str, Any]) -> None:
    cases = {case["case"]: case for case in out["cases"]}
    assert set(cases) == {"homogeneous", "heterogeneous", "wide", "wide-128", "teams-default", "teams-helios"}
    policies = {"shardyard", "shardyard-order", "fifo", "priority", "first-fit", "sjf-oracle"}
    assert policies == set(cases["homogeneous"]["policies"])
    assert set(cases["wide"]["gain_over"]) == {"fifo", "priority", "first-fit"}
    assert set(cases["wide-128"]["lost_gpu_h"]) == policies and "possible_gain_captured" in cases["wide-128"]
    assert 0 < cases["teams-default"]["jain_index"] <= 1
    assert isinstance(out["all_targets_met"], bool)
    assert set(out["start_estimates"]) == {
        f"{name}@0.9" for name in ("homogeneous", "heterogeneous", "wide", "wide-128")
    }
    assert all(set(audit) == {"jobs", "at_submission", "halfway"} for audit in out["start_estimates"].values())
    assert isinstance(out["start_estimates_targets_met"], bool)
    assert out["scale"]["jobs"] > 0 and out["scale"]["replay_s"] >= 0
    elastic = {case["case"]: case for case in out["elastic"]}
    assert set(elastic) == {f"elastic-{name}" for name in ("homogeneous", "heterogeneous", "wide", "wide-128")}
    assert all(case["elastic_jobs"] > 0 and case["utilisation_vs_rigid"] > 0 for case in elastic.values())
    assert isinstance(out["elastic_targets_met"], bool)


def check_monitor(out: dict[str, Any]) -> None:
    assert out["bench"] == "monitor" and out["pool"] == "process"
    assert out["heartbeats_sent"] > 0 and out["heartbeats_per_s_sent"] > 0
    assert 0 < out["nodes_seen"] <= out["nodes"]
    assert out["rss_mib_max"] > 0 and out["api_nodes_ms_p50"] > 0 and out["metrics_bytes"] > 0
    assert "cpu_percent_pool" in out and "consumer_lag_messages_max" in out


def check_link_probes(out: dict[str, Any]) -> None:
    assert out["bench"] == "link_probes"
    assert [r["nodes"] for r in out["results"]] == [6, 12]
    for result in out["results"]:
        assert result["rounds"]["probes"] > 0 and result["topic_after_run"]["messages"] > 0
        assert result["probes_per_node_round_vs_promised"]["measured_mean"] > 0
    assert out["per_node_growth"] > 0 and isinstance(out["all_targets_met"], bool)


def check_scale(out: dict[str, Any]) -> None:
    assert out["benchmark"] == "scale" and out["config"]["broker"] == "kafka"
    [run] = out["runs"]
    assert "error" not in run, run.get("error")
    assert run["latency"]["submit_to_scheduled_ms"]["count"] > 0 and run["latency"]["by_minute"]
    assert run["cpu_percent"]["broker"] > 0 and run["node_simulator_cpu_ms_per_node_per_s"] > 0
    assert run["broker_over_time"] and all(point["rss_mib"] for point in run["broker_over_time"])
    assert set(run["pool_heartbeats_per_s"]) == {"resource-pool-0", "resource-pool-1"}
    assert run["publisher"] == "relay" and sum(run["pool_beats_per_s"].values()) > 0
    assert run["detection"], "the stopped node was not judged"


def check_broker_growth(out: dict[str, Any]) -> None:
    assert out["benchmark"] == "broker_growth" and out["broker"] == "kafka"
    assert len(out["samples"]) == 2 and all(s["broker_rss_mib"] and s["broker_cpu_percent"] > 0 for s in out["samples"])
    assert out["rss_growth_last_half_vs_first"] is not None


def check_loaded_host(out: dict[str, Any]) -> None:
    assert out["bench"] == "loaded_host" and out["hog_processes"] >= 1
    assert set(out["jobs"]) == {"loaded-a", "loaded-b"} and all(j["state"] for j in out["jobs"].values())
    assert out["loop_lag_ms"]["beats"] > 0 and out["loop_lag_ms"]["p50"] is not None
    assert out["stopped_node"]["lost_s"] is not None, out["stopped_node"]
    assert out["cpu_percent"]["hog"] > 0 and "false_suspects_per_node_hour" in out


def check_cli_latency(out: dict[str, Any]) -> None:
    assert out["bench"] == "cli_latency" and out["hog_processes"] >= 1 and out["job_state_after"] == "SUCCEEDED"
    for phase in ("idle", "loaded"):
        assert set(out[phase]) == {"status", "jobs", "nodes", "history"}
        assert all(f["p95_s"] > 0 and f["cli_cpu_s"] > 0 for f in out[phase].values())
    assert out["cpu_percent"]["hog"] > 0 and isinstance(out["all_under_target"], bool)


def check_elastic(out: dict[str, Any]) -> None:
    assert out["bench"] == "elastic"
    scaled = out["autoscale"]
    assert scaled["placed_on"] == ["auto-v100-0"] and scaled["node_alive_s"] > 0 and scaled["autoscale_up_s"] > 0
    assert scaled["removed_s"] > 0 and scaled["adds_after_removal"] == 0 and scaled["cpu_s"]["watch"]
    assert out["elastic_start"]["world_size"] == 1 and out["elastic_start"]["submit_to_running_s"] > 0
    resized = out["resize"]
    assert resized["started_at_shards"] == 2 and resized["resizes"][:2] == ["resized 2 -> 4", "resized 4 -> 2"]
    assert (
        resized["grow"]["scale_up_s"] > 0 and resized["shrink"]["shrink_s"] > 0 and not resized["shrink"]["preempted"]
    )
    assert resized["retries"] == 0 and resized["loss_ratio"] > 0 and resized["cpu_s"]


def check_straggler(out: dict[str, Any]) -> None:
    assert out["bench"] == "straggler"
    swapped = out["swap"]
    assert swapped["verdict"]["kind"] == "SLOW_NODE" and swapped["verdict"]["shard_index"] == 2
    # The slowed node is whichever rank 2 was placed on: it must be gone from the re-formed gang.
    assert swapped["verdict"]["action"] == "SWAP" and swapped["slowed"]["node"] not in swapped["placed_after"]
    assert swapped["detect_s"] > 0 and swapped["replace_s"] > swapped["detect_s"] and swapped["retries"] == 0
    assert swapped["steps_per_s"]["before"] > 0 and swapped["cpu_s"]
    assert swapped["alert"] is not None and swapped["alert"]["alert_s"] > 0  # the monitor's STRAGGLER alert, live
    link = out["link"]  # a node's network slowed: a link is named, and nothing is swapped
    assert (link["verdict"]["kind"], link["verdict"]["action"], link["swapped"]) == ("SLOW_LINK", "NOT_A_NODE", False)
    assert link["slowed"]["node"] in (link["verdict"]["node_id"], link["verdict"]["peer_id"])
    imbalanced = out["imbalanced"]["verdict"]  # slices of 2 and 1 samples: rank 0 is slower, but no node is
    assert (imbalanced["kind"], imbalanced["shard_index"], imbalanced["action"]) == ("IMBALANCED_JOB", 0, "NOT_A_NODE")
    healthy = out["healthy"]
    assert healthy["jobs"] == 4 and healthy["false_swaps"] >= 0 and healthy["cpu_s"]
    assert set(out["targets"]) >= {"detect_s <= 30", "false_swaps == 0"}


SMOKES = [
    Smoke("training.py", check_training),
    Smoke("skeleton.py", check_skeleton),
    Smoke("recovery.py", check_recovery, timeout_s=240.0),
    Smoke("placement.py", check_placement),
    Smoke("schedule_quality.py", check_schedule_quality),
    Smoke("monitor.py", check_monitor),
    Smoke("link_probes.py", check_link_probes),
    Smoke("scale.py", check_scale),
    Smoke("broker_growth.py", check_broker_growth),
    Smoke("loaded_host.py", check_loaded_host, timeout_s=300.0),
    Smoke("cli_latency.py", check_cli_latency, timeout_s=240.0),
    Smoke("elastic.py", check_elastic, timeout_s=900.0),  # two clusters; the resize part trains two jobs (no noise)
    Smoke("straggler.py", check_straggler, timeout_s=700.0),  # four clusters; a swap, a link, a split, four jobs
]
INTERRUPT_GRACE_S = 30.0
"""A bench past its timeout gets SIGINT first, so that its ``finally`` takes its clusters down, then SIGKILL."""


def run_smoke(script: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(BENCH / script), "--smoke"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"{script} --smoke still running after {timeout_s} s; stderr:\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.parametrize(
    "smoke",
    [
        # The test's own timeout (the suite's is 300 s) covers the bench's, its interrupt's grace and the kill's.
        pytest.param(s, id=s.script.removesuffix(".py"), marks=pytest.mark.timeout(s.timeout_s + 3 * INTERRUPT_GRACE_S))
        for s in SMOKES
    ],
)
def test_bench_runs_in_smoke_mode(smoke: Smoke) -> None:
    done = run_smoke(smoke.script, smoke.timeout_s)

    assert done.returncode == 0, f"exit {done.returncode}; stderr:\n{done.stderr[-3000:]}"
    try:
        out = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        pytest.fail(f"{smoke.script} --smoke did not print JSON ({exc}):\n{done.stdout[-3000:]}")
    smoke.check(out)


def test_every_bench_has_a_smoke_test() -> None:
    scripts = {path.name for path in BENCH.glob("*.py") if ENTRY_POINT in path.read_text()}
    smoked = {smoke.script for smoke in SMOKES}

    assert scripts - smoked - PENDING - set(STARTED_BY) == set(), "benches without a smoke test here"
    assert smoked | PENDING <= scripts, "a smoke test or a pending name for a script that is not a bench"
    assert set(STARTED_BY.values()) <= smoked | PENDING
