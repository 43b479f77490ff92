"""Which local cluster a command talks to, the user-level default ``up`` leaves for it, and where in its folder each
cluster run's shard logs are."""

import argparse
import contextlib
import json
import os
import re
import secrets
import time
from pathlib import Path

from shardyard.cli.children import CLUSTER_FILE

DEFAULT_RUN_DIR = ".shardyard"
DEMO_RUN_DIR = ".shardyard-demo"
"""The demo's own folder: it starts a cluster of its own, never in the folder of one you started."""
SHARD_LOGS = Path("logs") / "shards"
"""The agents' log folders under the run folder: one per cluster run, ``SHARD_LOGS/RUN_ID`` (each agent's
``--log-dir``), holding ``<job>/shard-N-attempt-M.log``. A job id is unique within a cluster only: a later cluster
started from the same folder may run a job of the same id again, with attempts of the same numbers."""
RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{6}")


def user_default_file() -> Path:
    """Where ``up`` records the run folder of the cluster it started: the user-level default of every command."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "shardyard" / "run-dir"


def run_dir_of(args: argparse.Namespace) -> Path:
    """The cluster's folder: ``--run-dir`` (before or after the subcommand), else ``SHARDYARD_RUN_DIR``, else
    ``./.shardyard`` when a cluster runs from there, else the one ``up`` last started (``user_default_file``), else
    ``./.shardyard``."""
    named = getattr(args, "sub_run_dir", None) or args.run_dir or os.environ.get("SHARDYARD_RUN_DIR")
    if named:
        return Path(named)
    here = Path(DEFAULT_RUN_DIR)
    if (here / CLUSTER_FILE).exists():
        return here
    try:
        recorded = Path(user_default_file().read_text().strip())
    except OSError:
        return here
    return recorded if (recorded / CLUSTER_FILE).exists() else here


def start_dir_of(args: argparse.Namespace, default: str = DEFAULT_RUN_DIR) -> Path:
    """The folder a new cluster starts in: ``--run-dir``, else ``SHARDYARD_RUN_DIR``, else ``default`` here; never
    the user-level default, which names a cluster already started (commands that read a cluster follow it)."""
    named = getattr(args, "sub_run_dir", None) or args.run_dir or os.environ.get("SHARDYARD_RUN_DIR")
    return Path(named or default)


def remember(run_dir: Path) -> None:
    """Make ``run_dir`` the user-level default (best effort: a read-only home only loses the convenience)."""
    with contextlib.suppress(OSError):
        path = user_default_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{run_dir.resolve()}\n")


def new_run_id() -> str:
    """A cluster run's id: when ``up`` started it (UTC, so that ids sort in the order runs started) and a random
    part, ``20250102T030405Z-1a2b3c``."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def shard_log_dir(run_dir: Path, job_id: str) -> Path:
    """The agents' log folder holding ``job_id``'s shard logs: that of the cluster run from ``run_dir`` (its
    ``cluster.json``), whether or not it has any yet; with no cluster there, that of the newest run with logs of the
    job; else ``SHARD_LOGS`` itself, where clusters of before runs were told apart kept theirs."""
    shards = run_dir / SHARD_LOGS
    try:
        running = json.loads((run_dir / CLUSTER_FILE).read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        running = None
    if running:
        return shards / running
    with contextlib.suppress(OSError):
        runs = sorted(p.name for p in shards.iterdir() if RUN_ID.fullmatch(p.name) and (p / job_id).is_dir())
        if runs:
            return shards / runs[-1]
    return shards
