"""``shardyard history``: jobs as the accounting database keeps them (``sacct``'s answer to Slurm's database).

It reads the database itself, never the cluster: it answers with no cluster running, after ``shardyard down`` and
after a later ``shardyard up`` whose embedded broker remembers nothing. Which database: ``--accounting-url``, else
``SHARDYARD_ACCOUNTING_URL``, else the one the running cluster of the run folder writes (its ``cluster.json``), else
``RUN_DIR/accounting.db``.
"""

import argparse
import contextlib
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeAlias

from shardyard.cli import usage
from shardyard.cli.cluster_info import ClusterInfo
from shardyard.errors import ClusterError
from shardyard.jobdb.urls import default_url

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
URL_ENV = "SHARDYARD_ACCOUNTING_URL"

OUTPUT_NAMES = ("table", "wide", "json", "csv")
"""``-o``'s choices: ``history_render.OUTPUTS``'s names (a test holds them equal; the renderer loads only when
history runs)."""
DEFAULT_LIMIT = 1000
"""``--limit``'s default (``shardyard.jobdb.query.DEFAULT_LIMIT``, which a test holds equal)."""


def accounting_url(given: str | None, run_dir: Path, env: Mapping[str, str]) -> str:
    """The database ``history`` reads (see the module's docstring for the order)."""
    if given:
        return given
    if env.get(URL_ENV):
        return env[URL_ENV]
    with contextlib.suppress(ClusterError):
        running = ClusterInfo.load(run_dir).accounting_url
        if running:
            return running
    return default_url(run_dir)


def add_parser(sub: Commands, run_dir: Callable[[argparse.Namespace], Path]) -> None:
    def command(args: argparse.Namespace) -> int:
        url = accounting_url(args.accounting_url, run_dir(args), os.environ)
        params = {"since": args.since, "state": args.state, "job": args.job, "limit": str(args.limit)}
        from shardyard.cli.history_render import OUTPUTS  # the records' models: loaded when history runs
        from shardyard.jobdb.query import query_of
        from shardyard.jobdb.store import open_store

        query = query_of({k: v for k, v in params.items() if v}, datetime.now(UTC))
        store = open_store(url, create=False)
        try:
            found = store.select(query)
        finally:
            store.close()
        print(OUTPUTS[args.output](found))
        return 0

    history = sub.add_parser(
        "history",
        help="jobs from the accounting database: times, wait, run time, GPU-hours, attempts, ETTR, result, final loss",
        **usage.of("history"),
    )
    history.add_argument(
        "--since",
        help="jobs not ended or ended since then: a duration back from now (90s, 15m, 2h, 7d, 1h30m) or an ISO time",
    )
    history.add_argument("--state", help="only jobs in this state (SUCCEEDED, FAILED, CANCELLED, RUNNING, ...)")
    history.add_argument("--job", help="only this job id")
    history.add_argument(
        "--limit", type=int, default=DEFAULT_LIMIT, help=f"at most this many (default {DEFAULT_LIMIT})"
    )
    history.add_argument(
        "-o",
        "--output",
        choices=OUTPUT_NAMES,
        default="table",
        help="table (wide: with the goodput ledger's parts), json or csv",
    )
    history.add_argument(
        "--accounting-url",
        help=f"the database: sqlite:///PATH or postgresql://... (env {URL_ENV}; default: the cluster's, else "
        "RUN_DIR/accounting.db)",
    )
    history.set_defaults(func=command)
