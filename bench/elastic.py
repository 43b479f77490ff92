"""Elasticity on a local cluster (prints JSON): the autoscaler that adds a node for a waiting job and removes it once
idle, an elastic job that starts smaller than it prefers, and a running elastic gang grown and shrunk without a
restart (issue 35).

``autoscale``: ``shardyard up --autoscale`` with one A100:1 node; the autoscaler may add one V100:2 node (the
``local`` provider starts its agent). A job needing two V100s is submitted. Measured, from the job's first
``unschedulable`` verdict (the scheduler's capacity request follows it):

- ``node_alive_s``: until the added node is ALIVE (the monitor's node list, polled every 0.1 s);
- ``autoscale_up_s``: until the job is placed there (its ``scheduled`` event);
- from the job's end (``succeeded``): ``removed_s``, until the added agent's process is gone and the node left the
  cluster file (idle past ``--idle-s``, the added node's ``--lifetime-s`` and the ``--cooldown-s``);
- then, for ``--watch-s`` (600 s: the issue's ten minutes) with nothing waiting: ``adds_after_removal`` and
  ``removes_after_removal`` (the autoscaler's own counters, which must stay put: no flapping).

``elastic_start``: on the same cluster (its A100:1 node), a job preferring 4 shards with ``elasticity``
``{"min_shards": 1, "max_shards": 4}``: ``world_size`` (the shards it was placed with: 1, where a rigid job of 4
would wait), ``submit_to_running_s`` (every shard started) and ``submit_to_first_step_s``.

CPU seconds per component over each phase (``cpu_s``: the processes' user + system time from ``/proc``, the
broker's included) sit beside the latencies.

``resize``: on a cluster of its own, a running elastic gang grown from 2 to 4 shards and shrunk back to 2 for a
higher-priority job (``scale_up_s``, ``steps_lost``, ``shrink_s``, the final loss against a fixed-size run's): see
``bench/elastic_resize.py``.

    python bench/elastic.py [--only autoscale|resize] [--watch-s 600] [--cooldown-s 5] [--lifetime-s 5] [--idle-s 5]
        [--steps 3000] [--resize-cooldown-s 30] [--vip-s 30] [--no-noise] [--smoke]
"""

import argparse
import json
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from elastic_resize import resize
from shardyard.cli import client, cluster
from shardyard.cli.children import alive
from shardyard.cli.cluster_info import ClusterInfo, get_json
from shardyard.training.artifacts import create_demo_artifacts
from smoke import parse_args

EXAMPLE = json.loads((Path(__file__).parents[1] / "examples" / "fine_tune_gpt2.json").read_text())
ADDED = "auto-v100-0"
"""The node the autoscaler adds: the local provider names its first V100 node so."""
SMOKE = {"watch_s": 5.0, "steps": 1500, "vip_s": 45.0, "resize_cooldown_s": 2.0, "noise": False}
TICK = 1.0 / 3  # /proc's clock ticks are 1/100 s: CPU is read once per phase, not per poll


def _job(task_id: str, *, count: int, model: str, steps: int, elastic: bool = False) -> bytes:
    document = {**EXAMPLE, "task_id": task_id, "sync_interval": 10, "shard_count": count}
    gpu = {"count": count, "model": model, "min_flops": 15 if model == "V100" else 35}
    document["resource_requirements"] = {**EXAMPLE["resource_requirements"], "gpu": gpu}
    document["training"] = {"max_steps": steps, "batch_size": 2}
    if elastic:
        document["elasticity"] = {"min_shards": 1, "max_shards": count}
    return json.dumps(document).encode()


def _cpu(pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) each live process has used so far, by component."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / 100.0
    return out


def _spent(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds per component between two readings (a process started in between counts from zero)."""
    return {name: round(after[name] - before.get(name, 0.0), 2) for name in sorted(after)}


def _until(check: Callable[[], Any], what: str, timeout_s: float, every_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every_s)
    raise SystemExit(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _first(job: Mapping[str, Any], event: str) -> float:
    return min(datetime.fromisoformat(e["at"]).timestamp() for e in job["timeline"] if e["event"] == event)


def _node(info: ClusterInfo, node_id: str) -> dict[str, Any] | None:
    nodes = get_json(f"{info.monitor_url}/api/nodes")["nodes"]
    return next((n for n in nodes if n["node_id"] == node_id), None)


def _actions(run_dir: Path) -> dict[str, float]:
    """The autoscaler's ``shardyard_autoscaler_actions_total``, by "action/outcome"."""
    port = ClusterInfo.load(run_dir).metrics_ports["autoscaler-0"]
    text = get_text(f"http://127.0.0.1:{port}/metrics")
    return {
        f"{s.labels['action']}/{s.labels['outcome']}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "shardyard_autoscaler_actions_total"
    }


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


def _pids(run_dir: Path) -> dict[str, int]:
    """Every process of the cluster now (the broker's, the services', the agents', the autoscaler's and its nodes')."""
    return {name: pid for name, pid in ClusterInfo.load(run_dir).pids.items() if pid}


def autoscale(run_dir: Path, info: ClusterInfo, watch_s: float) -> dict[str, Any]:
    cpu0 = _cpu(_pids(run_dir))
    submitted = client.submit(info.bootstrap, _job("needs-v100", count=2, model="V100", steps=40))
    _until(lambda: (_node(info, ADDED) or {}).get("status") == "ALIVE", f"{ADDED} ALIVE", 120)
    alive_at = time.time()
    done = client.wait(info.monitor_url, submitted.job_id, timeout_s=300, on_update=lambda _j: None)
    job = client.job(info.monitor_url, submitted.job_id) or done
    if job["state"] != "SUCCEEDED":
        raise SystemExit(f"the V100 job ended {job['state']}: {job.get('message')}")
    waited = _first(job, "unschedulable")
    cpu1 = _cpu(_pids(run_dir))
    added_pid = ClusterInfo.load(run_dir).pids[f"node-{ADDED}"]
    _until(lambda: not alive(added_pid) and f"node-{ADDED}" not in ClusterInfo.load(run_dir).pids, "removal", 300)
    removed_at = time.time()
    cpu2 = _cpu(_pids(run_dir))
    counted = _actions(run_dir)
    _until(lambda: time.time() - removed_at >= watch_s, "the watch", watch_s + 5, every_s=TICK)
    after = _actions(run_dir)
    cpu3 = _cpu(_pids(run_dir))
    return {
        "node_alive_s": round(alive_at - waited, 2),
        "autoscale_up_s": round(_first(job, "scheduled") - waited, 2),
        "placed_on": sorted({p["node_id"] for p in job["placements"]}),
        "removed_s": round(removed_at - _first(job, "succeeded"), 2),
        "watch_s": watch_s,
        "adds_after_removal": after.get("add/ok", 0) - counted.get("add/ok", 0),
        "removes_after_removal": after.get("remove/ok", 0) - counted.get("remove/ok", 0),
        "actions": after,
        "cpu_s": {
            "waiting_to_job_end": _spent(cpu0, cpu1),
            "job_end_to_removal": _spent(cpu1, cpu2),
            "watch": _spent(cpu2, cpu3),
        },
    }


def elastic_start(run_dir: Path, info: ClusterInfo) -> dict[str, Any]:
    cpu0 = _cpu(_pids(run_dir))
    submitted_at = time.time()
    submitted = client.submit(info.bootstrap, _job("elastic-4", count=4, model="A100", steps=40, elastic=True))
    done = client.wait(info.monitor_url, submitted.job_id, timeout_s=300, on_update=lambda _j: None)
    job = client.job(info.monitor_url, submitted.job_id) or done
    if job["state"] != "SUCCEEDED":
        raise SystemExit(f"the elastic job ended {job['state']}: {job.get('message')}")
    return {
        "preferred_shards": 4,
        "world_size": len(job["placements"]),
        "submit_to_running_s": round(_first(job, "running") - submitted_at, 2),
        "submit_to_first_step_s": round(datetime.fromisoformat(job["first_step_at"]).timestamp() - submitted_at, 2),
        "cpu_s": _spent(cpu0, _cpu(_pids(run_dir))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--watch-s", type=float, default=600.0, help="how long to watch for flapping after removal")
    parser.add_argument("--cooldown-s", type=float, default=5.0)
    parser.add_argument("--lifetime-s", type=float, default=5.0)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--only", choices=("autoscale", "resize"), help="one part only")
    parser.add_argument("--steps", type=int, default=3000, help="resize: the elastic and the fixed job's steps")
    parser.add_argument(
        "--resize-cooldown-s", type=float, default=30.0, help="resize: the scheduler's cooldown (its default)"
    )
    parser.add_argument("--vip-s", type=float, default=30.0, help="resize: how long the higher-priority job runs")
    parser.add_argument(
        "--no-noise",
        dest="noise",
        action="store_false",
        help="resize: skip the 2- and 1-shard references (the noise between fixed sizes' losses)",
    )
    args = parse_args(parser, SMOKE)
    scale = cluster.Autoscale(
        gpus=("V100:2",), max_nodes=1, cooldown_s=args.cooldown_s, min_lifetime_s=args.lifetime_s, idle_s=args.idle_s
    )
    with tempfile.TemporaryDirectory(prefix="shardyard-elastic-") as tmp:
        root = Path(tmp)
        create_demo_artifacts(root / "data")
        figures: dict[str, Any] = {}
        if args.only in (None, "autoscale"):
            run_dir = root / "run"
            quiet = lambda _m: None  # noqa: E731
            info = cluster.up(
                run_dir, nodes=("A100:1",), replicas=1, data_root=root / "data", autoscale=scale, say=quiet
            )
            try:
                figures["autoscale"] = autoscale(run_dir, info, args.watch_s)
                figures["elastic_start"] = elastic_start(run_dir, info)
            finally:
                cluster.down(run_dir, say=quiet)
        if args.only in (None, "resize"):
            figures["resize"] = resize(
                root,
                steps=args.steps,
                cooldown_s=args.resize_cooldown_s,
                vip_s=args.vip_s,
                cpu=lambda run_dir: _cpu(_pids(run_dir)),
                spent=_spent,
                noise=args.noise,
            )
    settings = {"cooldown_s": args.cooldown_s, "lifetime_s": args.lifetime_s, "idle_s": args.idle_s}
    print(json.dumps({"bench": "elastic", "settings": settings, **figures}, indent=2))


if __name__ == "__main__":
    main()
