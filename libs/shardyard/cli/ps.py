"""``shardyard ps``: every process of the local cluster, from its cluster file: name, replica, pid, whether it runs,
uptime, how often the supervisor restarted it, and its metrics port."""

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

from shardyard.cli import usage
from shardyard.cli.children import alive
from shardyard.cli.cluster_info import ClusterInfo
from shardyard.text_table import table

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def rows(info: ClusterInfo, now: float) -> list[dict[str, Any]]:
    """One row per process: the supervisor first, then in the cluster file's order."""
    pids: dict[str, int] = {}
    if info.supervisor_pid is not None:
        pids["supervisor"] = info.supervisor_pid
    pids.update(info.pids)
    out = []
    for name, pid in pids.items():
        service, _, replica = name.rpartition("-")
        running = alive(pid)
        started = info.started.get(name)
        out.append(
            {
                "name": name,
                "service": service if replica.isdigit() else name,
                "replica": int(replica) if replica.isdigit() else None,
                "pid": pid,
                "running": running,
                "uptime_s": round(now - started, 1) if running and started is not None else None,
                "restarts": info.restarts.get(name, 0),
                "metrics_port": info.metrics_ports.get(name),
            }
        )
    return out


def uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    whole = int(seconds)
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m" if whole >= 3600 else f"{whole // 60}m{whole % 60:02d}s"


def render(found: list[dict[str, Any]]) -> str:
    headers = ["PROCESS", "REPLICA", "PID", "STATE", "UPTIME", "RESTARTS", "METRICS"]
    lines = [
        [
            r["name"],
            "-" if r["replica"] is None else str(r["replica"]),
            str(r["pid"]),
            "running" if r["running"] else "gone",
            uptime(r["uptime_s"]),
            str(r["restarts"]),
            str(r["metrics_port"] or "-"),
        ]
        for r in found
    ]
    return table(lines, headers)


def add_parser(sub: Commands, run_dir: Callable[[argparse.Namespace], Path]) -> None:
    def command(args: argparse.Namespace) -> int:
        found = rows(ClusterInfo.load(run_dir(args)), time.time())
        print(json.dumps(found, indent=2) if args.output == "json" else render(found))
        return 0

    ps = sub.add_parser(
        "ps",
        help="every process of the local cluster: replica, pid, uptime, restarts, metrics port",
        **usage.of("ps"),
    )
    ps.add_argument("-o", "--output", choices=("table", "json"), default="table")
    ps.set_defaults(func=command)
