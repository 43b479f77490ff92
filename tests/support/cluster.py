"""A whole local cluster for end-to-end tests, started and driven through the CLI as a person would, and waits with
deadlines on what its monitor says."""

import json
import os
import subprocess
import sys
import time
import urllib.error
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from shardyard.cli.cluster import get_json
from shardyard.training.artifacts import create_demo_artifacts

ROOT = Path(__file__).parents[2]
EXAMPLE = json.loads((ROOT / "examples" / "fine_tune_gpt2.json").read_text())
"""The S15 example job, as a person submits it."""
T = TypeVar("T")


def cli(
    *args: str, run_dir: Path, stdin: bytes | None = None, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``shardyard --run-dir RUN_DIR ARGS...`` as its own process."""
    return subprocess.run(
        [sys.executable, "-m", "shardyard.cli.main", "--run-dir", str(run_dir), *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env if env is not None else {**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def job(task_id: str, *, sync_interval: int = 10, **training: int) -> bytes:
    """The S15 example under another id; with ``training`` knobs, shorter or longer and syncing every
    ``sync_interval`` steps."""
    document = json.loads(json.dumps(EXAMPLE))
    document["task_id"] = task_id
    if training:
        document["training"] = training
        document["sync_interval"] = sync_interval
    return json.dumps(document).encode()


@contextmanager
def local_cluster(
    run_dir: Path, nodes: Sequence[str] = (), *, env: dict[str, str] | None = None, timeout: float = 180
) -> Iterator[Path]:
    """``shardyard up`` (with ``--node`` per entry of ``nodes``; none: the defaults) on the demo's checkpoint and
    dataset, then ``shardyard down``."""
    create_demo_artifacts(run_dir / "data")
    node_args = [arg for gpus in nodes for arg in ("--node", gpus)]
    started = cli("up", *node_args, run_dir=run_dir, env=env, timeout=timeout)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield run_dir
    finally:
        stopped = cli("down", run_dir=run_dir, env=env, timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def wait_for(
    what: str, probe: Callable[[], T | None], timeout_s: float, describe: Callable[[], object] = lambda: ""
) -> T:
    """``probe``'s first truthy answer within ``timeout_s``. An HTTP or socket error (a 404 before the monitor saw
    the job, a monitor not listening yet) counts as not yet; ``describe`` says what was seen when time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = probe()
            if found:
                return found
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s. {describe()}")
        time.sleep(0.2)


def job_view(monitor_url: str, job_id: str) -> dict[str, Any]:
    """The monitor's view of one job (``/api/jobs/ID``); raises URLError (404) until it has seen the job."""
    found: dict[str, Any] = get_json(f"{monitor_url}/api/jobs/{job_id}")
    return found
