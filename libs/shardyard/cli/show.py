"""``shardyard status``, ``jobs``, ``nodes`` and ``alerts``: what the monitor shows, each with ``-o table|json|wide``
(``json``: the monitor's answer as it is; ``wide``: more columns), spelt as ``history`` and ``ps`` spell it.

As Slurm splits ``sinfo`` from ``squeue``: ``status`` without a job is the cluster at a glance (``/api/summary``),
``jobs`` the job listing (``/api/jobs``), and ``status JOB`` one job with its timeline (``/api/jobs/JOB``).
"""

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any, TypeAlias

from shardyard.cli import client, listing, render, usage
from shardyard.cli.cluster_info import ClusterInfo
from shardyard.cli.rundir import run_dir_of

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
OUTPUTS = ("table", "json", "wide")


def _monitor(args: argparse.Namespace) -> str:
    """The address of a monitor replica of the cluster that answers (the first one when none does)."""
    return ClusterInfo.load(run_dir_of(args)).live().monitor_url


def _print_json(answer: Any) -> None:
    print(json.dumps(answer, indent=2))


def cmd_status(args: argparse.Namespace) -> int:
    monitor_url = _monitor(args)
    if args.job is None:
        summary = client.listing(monitor_url, "summary")
        if args.output == "json":
            _print_json(summary)
        else:
            print(listing.cluster_summary(summary, monitor_url, wide=args.output == "wide"))
        return 0
    found = client.job(monitor_url, args.job)
    if found is None:
        print(f"no job {args.job!r} (see `shardyard jobs`)", file=sys.stderr)
        return 1
    if args.output == "json":
        _print_json(found)
        return 0
    print(render.job_detail(found, datetime.now(UTC)))
    print("timeline:")
    print(render.timeline(found))
    if args.output == "wide":
        print("loss:")
        print(render.loss_curve(found))
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    answer = client.listing(_monitor(args), "jobs")
    if args.output == "json":
        _print_json(answer)
    else:
        print(listing.jobs_table(answer["jobs"], datetime.now(UTC), wide=args.output == "wide"))
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    monitor_url = _monitor(args)
    answer = client.links(monitor_url) if args.links else client.listing(monitor_url, "nodes")
    wide = args.output == "wide"
    if args.output == "json":
        _print_json(answer)
    elif args.links:
        print(render.links_report(answer, wide=wide))
    else:
        print(listing.nodes_table(answer["nodes"], datetime.now(UTC), wide=wide))
    return 0


def cmd_alerts(args: argparse.Namespace) -> int:
    answer = client.listing(_monitor(args), "alerts")
    if args.output == "json":
        _print_json(answer)
    else:
        print(listing.alerts_table(answer, datetime.now(UTC), wide=args.output == "wide"))
    return 0


def add_output(command: argparse.ArgumentParser, *, json_alias: bool = False) -> None:
    """``-o/--output table|json|wide``; ``json_alias`` keeps the older ``--json`` as another way to ask for json."""
    command.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default="table",
        help="table (the default); json: the monitor's answer as it is; wide: a table with more columns",
    )
    if json_alias:
        command.add_argument(
            "--json",
            dest="output",
            action="store_const",
            const="json",
            default=argparse.SUPPRESS,
            help="the same as -o json",
        )


def add_status(sub: Commands) -> None:
    status = sub.add_parser(
        "status", help="the cluster at a glance, or one job with its reason and timeline", **usage.of("status")
    )
    status.add_argument("job", nargs="?", help="a job's id: its detail and timeline (default: the cluster summary)")
    add_output(status, json_alias=True)
    status.set_defaults(func=cmd_status)


def add_listings(sub: Commands) -> None:
    jobs = sub.add_parser(
        "jobs", help="list jobs: state, owner, queue, GPUs, progress, elapsed, reason", **usage.of("jobs")
    )
    add_output(jobs)
    jobs.set_defaults(func=cmd_jobs)

    nodes = sub.add_parser("nodes", help="list nodes, or the measured links between them", **usage.of("nodes"))
    nodes.add_argument(
        "--links",
        action="store_true",
        help=f"the measured links instead: an RTT matrix up to {render.MATRIX_NODES} live nodes, else the worst links",
    )
    add_output(nodes)
    nodes.set_defaults(func=cmd_nodes)

    alerts = sub.add_parser("alerts", help="alerts firing now and the recent history", **usage.of("alerts"))
    add_output(alerts, json_alias=True)
    alerts.set_defaults(func=cmd_alerts)
