"""Which local cluster a command talks to, and the user-level default ``up`` leaves for it."""

import argparse
import contextlib
import os
from pathlib import Path

from shardyard.cli.children import CLUSTER_FILE

DEFAULT_RUN_DIR = ".shardyard"


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


def remember(run_dir: Path) -> None:
    """Make ``run_dir`` the user-level default (best effort: a read-only home only loses the convenience)."""
    with contextlib.suppress(OSError):
        path = user_default_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{run_dir.resolve()}\n")
