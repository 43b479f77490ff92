"""A whole local cluster for end-to-end tests, started and driven through the CLI as a person would, and waits with
deadlines on what its monitor says."""

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.error
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from shardyard.bus.transport import TRANSPORT_ENVS
from shardyard.cli import client
from shardyard.cli.cluster import ClusterInfo, get_json
from shardyard.cli.cluster_info import ADMIN_PRINCIPAL
from shardyard.cluster_secret import SECRET_ENV
from shardyard.node_agent.private_files import interpreter_unreachable
from shardyard.node_agent.shard_users import DEFAULT_UID_BASE, ShardUser
from shardyard.training.artifacts import create_demo_artifacts
from tests.support import wait

ROOT = Path(__file__).parents[2]
EXAMPLE = json.loads((ROOT / "examples" / "fine_tune_gpt2.json").read_text())
"""The S15 example job, as a person submits it."""
ONE_REPLICA = ("--replicas", "1")
"""For a cluster whose test is not about failover: one process per service starts sooner and leaves the CPU to the
training (failover has its own tests: tests/integration, tests/chaos)."""
T = TypeVar("T")


def cli(
    *args: str,
    run_dir: Path,
    stdin: bytes | None = None,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    prefix: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """``shardyard --run-dir RUN_DIR ARGS...`` as its own process (under ``prefix``, e.g. a
    :func:`searchable_namespace`). A cluster started so gets a run folder its shards' users can reach (see
    :func:`reachable_by_shards`)."""
    if args[:1] in (("up",), ("demo",)):
        run_dir.mkdir(parents=True, exist_ok=True)
        reachable_by_shards(run_dir)
    environ = env if env is not None else {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [*prefix, sys.executable, "-m", "shardyard.cli.main", "--run-dir", str(run_dir), *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        # the CLI speaks to a secured broker as whom the command calls for (a team submits, the admin drains), not
        # as whom this process speaks (see speaking_as)
        env={name: value for name, value in environ.items() if name not in TRANSPORT_ENVS},
    )


def reachable_by_shards(path: Path) -> Path:
    """``path``, made searchable by every user, with each ancestor that was not: an agent running as root starts
    shards as users of their jobs' own, and those must reach the data, the logs (the agent's lease file) and the
    working directories under it, while pytest makes its temporary directories 0700. Nothing becomes listable or
    readable that was not: only the search bit is added, and only inside the temporary folder (a run folder in a
    0700 home directory stays out of reach: its agents then refuse its shards' launches and say why)."""
    temporary = Path(tempfile.gettempdir()).resolve()
    for directory in (path, *path.parents):
        found = os.stat(directory)
        if not found.st_mode & stat.S_IXOTH and directory.resolve().is_relative_to(temporary):
            directory.chmod(stat.S_IMODE(found.st_mode) | stat.S_IXGRP | stat.S_IXOTH)
    return path


SEARCHABLE = r"""
set -e
views=$1
shift
while [ "$1" != "--" ]; do
    closed=$1
    view="$views/$(printf %s "$closed" | tr / _)"
    shift
    mkdir -p "$view"
    mount --bind "$closed" "$view"
    mount -t tmpfs -o mode=0711 tmpfs "$closed"
    for entry in "$view"/* "$view"/.[!.]* "$view"/..?*; do
        [ -e "$entry" ] || [ -L "$entry" ] || continue
        name=${entry##*/}
        if [ -L "$entry" ]; then
            ln -s "$(readlink "$entry")" "$closed/$name"
            continue
        fi
        if [ -d "$entry" ]; then mkdir "$closed/$name"; else touch "$closed/$name"; fi
        mount --bind "$entry" "$closed/$name"
    done
done
shift
exec "$@"
"""
"""Run a command in a private mount namespace where each directory named before ``--`` reads as searchable by
everyone (0711) with the same contents (each entry bind-mounted from where the real directory is mounted, under
``$1``), outermost first: the processes started there, and only they, can hand a Python, a virtual environment or a
checkout under a 0700 directory to other users. The real directories are never changed."""


def closed_to_others() -> list[Path]:
    """The directories on the way to what a shard runs (this Python, its standard library, the virtual environment,
    this checkout's code) that other users may not search, outermost first."""
    import shardyard

    targets = [
        Path(sys.executable).resolve(),
        Path(os.__file__).resolve(),
        Path(sys.prefix),
        Path(shardyard.__path__[0]),
    ]
    closed: set[Path] = set()
    for target in targets:
        for directory in (*reversed(target.parents), target):
            if directory.is_dir() and not os.stat(directory).st_mode & stat.S_IXOTH:
                closed.add(directory)
    return sorted(closed, key=lambda path: len(path.parts))


def searchable_namespace(views: Path) -> list[str] | None:
    """The argv prefix that runs a command where other users can run this Python and this checkout (see
    ``SEARCHABLE``): empty when they already can; None when it cannot be arranged (not root, or no ``unshare``)."""
    closed = closed_to_others()
    if not closed:
        return []
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    views.mkdir(parents=True, exist_ok=True)
    return [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        SEARCHABLE,
        "sh",
        str(views),
        *map(str, closed),
        "--",
    ]


def shard_users_unavailable() -> str | None:
    """Why agents on this machine cannot start shards as users of their jobs' own (they refuse to start unless told
    ``--shard-user agent``); None when they can."""
    if os.geteuid() != 0:
        return "the tests do not run as root: agents cannot switch users"
    stranger = ShardUser(uid=DEFAULT_UID_BASE, gid=DEFAULT_UID_BASE)
    why = interpreter_unreachable(Path(sys.executable), Path(os.__file__).parent, stranger)
    return None if why is None else f"other users cannot run this Python: {why}"


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
    run_dir: Path,
    nodes: Sequence[str] = (),
    *,
    replicas: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 180,
    options: Sequence[str] = (),
) -> Iterator[Path]:
    """``shardyard up`` (with ``--node`` per entry of ``nodes``; none: the defaults; ``replicas`` processes per
    service, none: the default two; and ``options``) on the demo's checkpoint and dataset, then ``shardyard down``.
    The cluster is secured as ``up`` secures it: see :func:`user_submit` and :func:`as_operator`. Within, this
    process's own Kafka clients speak to its broker as the admin (:func:`speaking_as`)."""
    create_demo_artifacts(run_dir / "data")
    node_args = [arg for gpus in nodes for arg in ("--node", gpus)]
    replica_args = ["--replicas", str(replicas)] if replicas is not None else []
    started = cli("up", *node_args, *replica_args, *options, run_dir=run_dir, env=env, timeout=timeout)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        with speaking_as(ClusterInfo.load(run_dir), ADMIN_PRINCIPAL):
            yield run_dir
    finally:
        stopped = cli("down", run_dir=run_dir, env=env, timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def user_submit(info: ClusterInfo, raw: bytes) -> client.Submitted:
    """``raw`` submitted from this process as ``shardyard submit`` submits it to ``info``'s cluster: signed with the
    cluster's credentials file (``up``'s local keys) when it has one."""
    sealed, signed = client.sealed_submission(raw, info.credentials_file) if info.credentials_file else (raw, [])
    return client.submit(info.bootstrap, sealed, signed)


@contextmanager
def as_operator(info: ClusterInfo) -> Iterator[None]:
    """Within: the operator's commands called in this process (``client.request_drain``, ``request_cancel``) are
    sealed with ``info``'s cluster secret, as ``shardyard drain`` and ``cancel`` seal them."""
    before = os.environ.get(SECRET_ENV)
    if info.secret_file:
        os.environ[SECRET_ENV] = info.secret_file
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SECRET_ENV, None)
        else:
            os.environ[SECRET_ENV] = before


@contextmanager
def speaking_as(info: ClusterInfo, principal: str) -> Iterator[None]:
    """Within: every Kafka client this process makes (``bus.transport.client_options``) speaks to ``info``'s broker
    as ``principal`` (its password file, over TLS with SCRAM); nothing changes for a plain broker."""
    before = {name: os.environ.get(name) for name in TRANSPORT_ENVS}
    os.environ.update(info.transport(principal))
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def wait_for(
    what: str, probe: Callable[[], T | None], timeout_s: float, describe: Callable[[], object] = lambda: ""
) -> T:
    """``probe``'s first truthy answer within ``timeout_s``. An HTTP or socket error (a 404 before the monitor saw
    the job, a monitor not listening yet) counts as not yet; ``describe`` says what was seen when time runs out."""
    return wait.until(probe, what, timeout_s, every_s=0.2, tolerate=(urllib.error.URLError, OSError), describe=describe)


def job_view(monitor_url: str, job_id: str) -> dict[str, Any]:
    """The monitor's view of one job (``/api/jobs/ID``); raises URLError (404) until it has seen the job."""
    found: dict[str, Any] = get_json(f"{monitor_url}/api/jobs/{job_id}")
    return found
