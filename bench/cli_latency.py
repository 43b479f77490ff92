"""CLI reads on a loaded host (prints JSON): how long ``status``, ``jobs``, ``nodes`` and ``history`` take, each as
its own process as a user types it, on a real local cluster (``up``'s default: three nodes, two processes a
service) that has run a short 2-shard fine-tune (so every listing has a job, and ``history`` a row), first with the
host otherwise idle, then with a CPU hog keeping every core busy at normal priority (one spinning process a core).
``--training``: the job trains through both phases instead (its two shards keep the cores busy in the first phase too).

Printed, per phase (``idle``, ``loaded``) and command: ``p50_s``, ``p95_s`` and ``max_s`` of the wall time of
``--runs`` runs, and ``cli_cpu_s`` (the command's own CPU, user and system, mean per run); ``p95_ratio_loaded_vs_idle``
per command; ``target_p95_s`` (1.0) and ``all_under_target`` over the loaded phase; ``cpu_percent``: each of the
cluster's processes and the hog, over the loaded phase.

    python bench/cli_latency.py [--runs 20] [--max-steps 100] [--training] [--smoke]
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loaded_host import HOG, _job, cpu_seconds, percentile
from shardyard.cli import client, cluster
from shardyard.cli.cluster_info import ADMIN_PRINCIPAL
from shardyard.training.artifacts import create_demo_artifacts
from smoke import parse_args

COMMANDS = (("status",), ("jobs",), ("nodes",), ("history",))
TARGET_P95_S = 1.0
SMOKE = {"runs": 2, "max_steps": 20}
TRAINING_STEPS = 1_000_000
"""``--training``: a job that trains through both phases (the cluster stops it)."""


def timed(run_dir: Path, command: tuple[str, ...]) -> tuple[float, float]:
    """One run of ``shardyard --run-dir RUN_DIR COMMAND``: its wall time and its own CPU time (seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "shardyard.cli.main", "--run-dir", str(run_dir), *command],
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"shardyard {' '.join(command)} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return took, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def phase(run_dir: Path, runs: int) -> dict[str, dict[str, Any]]:
    """Each command ``runs`` times, interleaved (a burst of load hits every command alike)."""
    walls: dict[str, list[float]] = {" ".join(c): [] for c in COMMANDS}
    cpus: dict[str, list[float]] = {" ".join(c): [] for c in COMMANDS}
    for _ in range(runs):
        for command in COMMANDS:
            took, cpu = timed(run_dir, command)
            walls[" ".join(command)].append(took)
            cpus[" ".join(command)].append(cpu)
    return {
        name: {
            "p50_s": round(percentile(walls[name], 0.5) or 0.0, 3),
            "p95_s": round(percentile(walls[name], 0.95) or 0.0, 3),
            "max_s": round(max(walls[name]), 3),
            "cli_cpu_s": round(sum(cpus[name]) / len(cpus[name]), 3),
        }
        for name in walls
    }


def run(root: Path, runs: int, max_steps: int, training: bool) -> dict[str, Any]:
    data = root / "data"
    create_demo_artifacts(data)
    run_dir = root / "run"
    info = cluster.up(run_dir, data_root=data, say=lambda _m: None)
    os.environ.update(info.transport(ADMIN_PRINCIPAL))  # this process's clients, as the operator
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        client.submit(info.bootstrap, _job("cli-latency", TRAINING_STEPS if training else max_steps))
        awaited = ("RUNNING",) if training else ("SUCCEEDED", "FAILED")
        deadline = time.monotonic() + 300
        while (client.job(info.live().monitor_url, "cli-latency") or {}).get("state") not in awaited:
            if time.monotonic() > deadline:
                raise SystemExit(f"the job was not {' or '.join(awaited)} within 300 s")
            time.sleep(0.5)
        idle = phase(run_dir, runs)
        pids = {name: pid for name, pid in info.pids.items() if pid}
        hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(os.cpu_count() or 2)]
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        hog0, began = sum(cpu_seconds(h.pid) or 0.0 for h in hogs), time.monotonic()
        loaded = phase(run_dir, runs)
        wall = time.monotonic() - began
        cpu1 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        hog_cpu = sum(cpu_seconds(h.pid) or 0.0 for h in hogs) - hog0
        state = (client.job(info.live().monitor_url, "cli-latency") or {}).get("state")
    finally:
        for hog in hogs:
            hog.kill()
        cluster.down(run_dir, say=lambda _m: None)
    cpu_percent = {
        name: round(100 * ((cpu1[name] or 0.0) - before) / wall, 1)
        for name, before in cpu0.items()
        if before is not None and cpu1.get(name) is not None
    }
    return {
        "runs": runs,
        "training": training,
        "hog_processes": len(hogs),
        "job_state_after": state,
        "idle": idle,
        "loaded": loaded,
        "p95_ratio_loaded_vs_idle": {
            name: round(loaded[name]["p95_s"] / idle[name]["p95_s"], 2) if idle[name]["p95_s"] else None
            for name in loaded
        },
        "target_p95_s": TARGET_P95_S,
        "all_under_target": all(figures["p95_s"] < TARGET_P95_S for figures in loaded.values()),
        "loaded_s": round(wall, 1),
        "cpu_percent": {**cpu_percent, "hog": round(100 * hog_cpu / wall, 1)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="runs of each command in each phase")
    parser.add_argument("--max-steps", type=int, default=100, help="the job's steps (it ends before the phases)")
    parser.add_argument("--training", action="store_true", help="a job trains through both phases")
    args = parse_args(parser, SMOKE)
    with tempfile.TemporaryDirectory() as tmp:
        out = run(Path(tmp), args.runs, args.max_steps, args.training)
    print(json.dumps({"bench": "cli_latency", **out}, indent=2))


if __name__ == "__main__":
    main()
