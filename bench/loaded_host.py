"""Liveness on a loaded host (prints JSON): the control plane judges a starved host honestly.

A local cluster of four nodes (three ``A100:2`` and one idle ``A100:1``, the embedded or Kafka broker as ``up``
chooses) runs two 2-shard fine-tunes while a CPU hog keeps every core of this machine busy at normal priority (one
spinning process a core) for ``--load-s`` seconds (300). Once both jobs have ended and the load time has passed, with
the hog still running, the idle node's agent is stopped (``SIGSTOP``: a hung host) and its verdicts timed; then the
hog stops and the cluster goes down. Printed:

- ``jobs``: each job's end state, attempts and retries spent (``job.recovering`` events), and how long it ran under
  load; ``retries_spent`` in all;
- ``false_suspects`` / ``false_lost``: SUSPECT and LOST verdicts on nodes nobody stopped (from the node-state topic),
  and ``false_suspects_per_node_hour`` over the load;
- ``loop_lag_ms``: the agents' event-loop lag, p50 / p99 / max of each beat's worst since the previous beat (their
  heartbeats and leases), and ``margin_s_max``, the widest suspicion margin a beat asked for (``shardyard.liveness``);
- ``stopped_node``: ``suspect_s`` and ``lost_s``, from the stop to the pool's verdicts, under the same load;
- ``cpu_percent``: each process's CPU (the cluster's, by name, and the hog's), over the load.

    python bench/loaded_host.py [--load-s 300] [--max-steps 10000] [--smoke]
"""

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from shardyard.bus.replay import replay
from shardyard.bus.topics import HEARTBEATS, NODE_STATE, Topic
from shardyard.cli import client, cluster
from shardyard.cli.cluster_info import ADMIN_PRINCIPAL
from shardyard.events import Heartbeat, NodeLease, NodeState, NodeStatus
from shardyard.training.artifacts import create_demo_artifacts
from smoke import parse_args

EXAMPLE = json.loads((Path(__file__).parents[1] / "examples" / "fine_tune_gpt2.json").read_text())
NODES = ("A100:2", "A100:2", "A100:2", "A100:1")
IDLE = "node-3"
"""The node no job uses (1 GPU: a 2-shard job's gang fits on the others): stopped under load at the end."""
SMOKE = {"load_s": 10.0, "max_steps": 30}
TICKS = os.sysconf("SC_CLK_TCK")
HOG = "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\nwhile True: pass"


def _job(job_id: str, max_steps: int) -> bytes:
    document = {**EXAMPLE, "task_id": job_id, "sync_interval": 20, "shard_count": 2}
    document["resource_requirements"] = {**EXAMPLE["resource_requirements"], "gpu": {"count": 2, "model": "A100"}}
    document["training"] = {"max_steps": max_steps, "batch_size": 4, "seed": 5}
    return json.dumps(document).encode()


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS


def events(bootstrap: str, topic: Topic) -> list[Any]:
    found: list[Any] = []
    asyncio.run(replay(bootstrap, [topic], lambda _t, event: found.append(event)))
    return found


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def verdicts(states: list[NodeState], since: datetime, until: datetime) -> dict[str, list[tuple[NodeStatus, float]]]:
    """Per node, each change of status within the window, with its time (Unix seconds)."""
    last: dict[str, NodeStatus] = {}
    changes: dict[str, list[tuple[NodeStatus, float]]] = {}
    for state in sorted(states, key=lambda s: s.occurred_at):
        before, last[state.node_id] = last.get(state.node_id), state.status
        if since <= state.occurred_at <= until and before is not None and before is not state.status:
            changes.setdefault(state.node_id, []).append((state.status, state.occurred_at.timestamp()))
    return changes


def run(root: Path, load_s: float, max_steps: int) -> dict[str, Any]:
    data = root / "data"
    create_demo_artifacts(data)
    info = cluster.up(root / "run", nodes=list(NODES), data_root=data, say=lambda _m: None)
    os.environ.update(info.transport(ADMIN_PRINCIPAL))  # this process's clients, as the operator
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        pids = {name: pid for name, pid in info.pids.items() if pid}
        began = datetime.now().astimezone()
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(os.cpu_count() or 2)]
        hog_cpu0 = sum(cpu_seconds(h.pid) or 0.0 for h in hogs)
        load_began = time.monotonic()
        jobs = ("loaded-a", "loaded-b")
        for job_id in jobs:
            client.submit(info.bootstrap, _job(job_id, max_steps))
        ended: dict[str, dict[str, Any]] = {}
        ran_from: dict[str, float] = {}
        while len(ended) < len(jobs) or time.monotonic() - load_began < load_s:
            for job_id in jobs:
                if job_id in ended:
                    continue
                try:
                    detail = cluster.get_json(f"{info.live().monitor_url}/api/jobs/{job_id}")
                except OSError:
                    continue
                if detail["state"] == "RUNNING":
                    ran_from.setdefault(job_id, time.monotonic())
                if detail["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    detail["ran_under_load_s"] = round(time.monotonic() - ran_from.get(job_id, time.monotonic()), 1)
                    ended[job_id] = detail
            if time.monotonic() - load_began > load_s + 900:
                raise SystemExit(f"jobs not ended 15 min past the load: {sorted(set(jobs) - set(ended))}")
            time.sleep(1.0)
        loaded_for = time.monotonic() - load_began
        # Under the same load: a node really stopped.
        stopped_at = time.time()
        os.kill(info.pids[IDLE], signal.SIGSTOP)
        deadline = time.monotonic() + 60
        stopped: dict[str, float] = {}
        while "LOST" not in stopped and time.monotonic() < deadline:
            node = client.node(info.live().monitor_url, IDLE) or {}
            if node.get("status") in ("SUSPECT", "LOST"):
                stopped.setdefault(str(node["status"]), time.time())
            time.sleep(0.2)
        hog_cpu = sum(cpu_seconds(h.pid) or 0.0 for h in hogs) - hog_cpu0
        cpu1 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        wall = time.monotonic() - load_began
        until = datetime.now().astimezone()
        os.kill(info.pids[IDLE], signal.SIGCONT)
        for hog in hogs:
            hog.terminate()
        states = [e for e in events(info.bootstrap, NODE_STATE) if isinstance(e, NodeState)]
        beats = [e for e in events(info.bootstrap, HEARTBEATS) if isinstance(e, Heartbeat | NodeLease)]
    finally:
        for hog in hogs:
            hog.kill()
        cluster.down(root / "run", say=lambda _m: None)
    changes = verdicts(states, began, until)
    stop = datetime.fromtimestamp(stopped_at).astimezone()
    judged = {n: [(s, t) for s, t in c if n != IDLE or t < stop.timestamp()] for n, c in changes.items()}
    false_suspects = sum(1 for c in judged.values() for s, _ in c if s is NodeStatus.SUSPECT)
    false_lost = sum(1 for c in judged.values() for s, _ in c if s is NodeStatus.LOST)
    # The beats of the load, less the stopped agent's from its stop on (its first beat after SIGCONT tells the stop).
    loaded = [b for b in beats if b.occurred_at >= began and (b.node_id != IDLE or b.occurred_at < stop)]
    lags = [b.loop_lag_s * 1000 for b in loaded]
    retries = {j: sum(1 for e in d.get("timeline", []) if e["event"] == "recovering") for j, d in ended.items()}
    node_hours = len(NODES) * loaded_for / 3600
    return {
        "load_s": round(loaded_for, 1),
        "hog_processes": len(hogs),
        "jobs": {
            j: {
                "state": d["state"],
                "attempt": d.get("attempt"),
                "retries": retries[j],
                "ran_under_load_s": d["ran_under_load_s"],
            }
            for j, d in ended.items()
        },
        "retries_spent": sum(retries.values()),
        "false_suspects": false_suspects,
        "false_lost": false_lost,
        "false_suspects_per_node_hour": round(false_suspects / node_hours, 2),
        "verdicts": {n: [(s.value, round(t - began.timestamp(), 1)) for s, t in c] for n, c in changes.items()},
        "loop_lag_ms": {
            "beats": len(lags),
            "p50": percentile(lags, 0.5),
            "p99": percentile(lags, 0.99),
            "max": max(lags, default=None),
        },
        "margin_s_max": max((b.margin_s for b in loaded), default=0.0),
        "stopped_node": {
            "node": IDLE,
            "suspect_s": round(stopped["SUSPECT"] - stopped_at, 2) if "SUSPECT" in stopped else None,
            "lost_s": round(stopped["LOST"] - stopped_at, 2) if "LOST" in stopped else None,
        },
        "cpu_percent": {
            **{
                name: round(100 * ((cpu1[name] or 0.0) - before) / wall, 1)
                for name, before in cpu0.items()
                if before is not None and cpu1.get(name) is not None
            },
            "hog": round(100 * hog_cpu / wall, 1),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load-s", type=float, default=300.0, help="how long the hog keeps every core busy")
    parser.add_argument("--max-steps", type=int, default=10_000, help="each job's training steps (~5 min under load)")
    args = parse_args(parser, SMOKE)
    with tempfile.TemporaryDirectory() as tmp:
        out = run(Path(tmp), args.load_s, args.max_steps)
    out["loop_lag_ms"].update({k: round(v, 1) for k, v in out["loop_lag_ms"].items() if isinstance(v, float)})
    print(json.dumps({"bench": "loaded_host", **out}, indent=2))


if __name__ == "__main__":
    main()
