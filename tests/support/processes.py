"""Running a service as the real, separate process it is in production."""

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.support.cluster import reachable_by_shards


def _shards_reach(args: Sequence[str]) -> None:
    """A node agent's shards run as their jobs' users: its log folder (the lease file) and its mounted folders must
    be reachable by them, though pytest makes its temporary directories 0700."""
    for flag, value in itertools.pairwise(args):
        if flag in ("--log-dir", "--mounts"):
            folder = Path(value.partition("=")[2] if flag == "--mounts" else value)
            folder.mkdir(parents=True, exist_ok=True)
            reachable_by_shards(folder)


@contextmanager
def service(module: str, args: Sequence[str], *, bootstrap: str, log_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    if module == "shardyard.node_agent":
        _shards_reach(args)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{module.rsplit('.', 1)[-1]}-{time.monotonic_ns()}.log"
    env = {**os.environ, "SHARDYARD_KAFKA_BOOTSTRAP": bootstrap, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", module, *args], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        if os.environ.get("SHARDYARD_TEST_LOGS"):
            print(log_path.read_text(errors="replace"))
