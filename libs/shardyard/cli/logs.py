"""``shardyard logs``: a job's shard logs, from the agents' log folder of this cluster run (``rundir.shard_log_dir``):
each shard's newest attempt unless told one, followed with ``--follow`` until the job ends. Shards that started and
wrote nothing yet are said to have no output yet, rather than nothing printed."""

import argparse
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from shardyard.cli import client, render, usage
from shardyard.cli.cluster_info import ClusterInfo
from shardyard.cli.rundir import run_dir_of, shard_log_dir
from shardyard.errors import ClusterError

if TYPE_CHECKING:
    Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

InfoOf = Callable[[argparse.Namespace], ClusterInfo]


def add_parser(sub: "Commands", info_of: InfoOf) -> None:
    logs = sub.add_parser(
        "logs", help="a job's shard logs (each shard's newest attempt unless --attempt)", **usage.of("logs")
    )
    logs.add_argument("job")
    logs.add_argument("--shard", type=int, help="only this shard (by index)")
    logs.add_argument("--attempt", type=int, help="this attempt instead of the newest")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the job ends")
    logs.add_argument("--log-dir", help="the agents' log folder (default: this cluster run's, RUN_DIR/logs/shards/RUN)")
    logs.add_argument("--interval", type=float, default=0.25, help="seconds between reads with --follow")
    logs.set_defaults(func=lambda args: cmd_logs(args, info_of))


def _job_ended(args: argparse.Namespace, job_id: str, info_of: InfoOf) -> bool:
    """Whether the local cluster's monitor shows the job ended; False when there is no cluster to ask."""
    try:
        found = client.job(info_of(args).monitor_url, job_id)
    except ClusterError:
        return False
    return found is not None and found["state"] in client.TERMINAL_STATES


def cmd_logs(args: argparse.Namespace, info_of: InfoOf) -> int:
    from shardyard.events.submission import JOB_ID_PATTERN

    if not re.fullmatch(JOB_ID_PATTERN, args.job):
        return _fail(f"{args.job!r} is not a job id")
    log_dir = Path(args.log_dir) if args.log_dir else shard_log_dir(run_dir_of(args), args.job)  # this run's
    tail = client.LogTail(log_dir, args.job, shard=args.shard, attempt=args.attempt)
    if not client.shard_logs(log_dir, args.job, shard=args.shard, attempt=args.attempt):
        which = "".join(f" {k} {v}" for k, v in (("shard", args.shard), ("attempt", args.attempt)) if v is not None)
        if not args.follow:
            return _fail(f"no logs of job {args.job}{which} under {log_dir} (a shard writes one once it starts)")
        print(f"waiting for logs of job {args.job}{which} under {log_dir}", file=sys.stderr)
    several = args.shard is None

    def show(lines: list[tuple[client.ShardLog, str]]) -> None:
        for log, line in lines:
            print(render.log_line(log.shard, log.attempt, line, prefixed=several), flush=True)

    first = tail.poll(final=not args.follow)
    show(first)
    written = client.shard_logs(log_dir, args.job, shard=args.shard, attempt=args.attempt)
    if written and not first:  # the shards started and have written nothing yet: say so rather than nothing
        attempts = ", ".join(str(a) for a in sorted({log.attempt for log in written}))
        following = "; following them" if args.follow else ""
        print(
            f"no output yet from job {args.job}: its {len(written)} shard logs of attempt {attempts} under {log_dir}"
            f" are empty{following}",
            file=sys.stderr,
        )
    while args.follow:
        time.sleep(args.interval)
        ended = _job_ended(args, args.job, info_of)  # asked before reading, so the last lines are read after it ended
        show(tail.poll(final=ended))
        if ended:
            break
    return 0


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1
