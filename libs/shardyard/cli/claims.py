"""Local clusters never collide: one cluster per run folder, and each its own rendezvous ports on this host.

- **A run folder is in use while a process of its cluster runs** (``running``), judged by the processes its
  ``cluster.json`` names: each alive and started no later than the file says it was (a pid the kernel has since given
  to another process is not the cluster's). A stale file, left by a cluster whose processes all died, holds nothing.
- **One start at a time per folder**: ``up`` starts a cluster only under the folder's start lock (``starting``, an
  flock the kernel drops when ``up`` ends, however it ends), so a second ``up`` there is refused at once rather than
  overwriting the first's cluster file, and a failed start removes only its own file.
- **Rendezvous ports are claimed host-wide** (``claim_rendezvous``): a cluster takes a block of
  ``RENDEZVOUS_PER_NODE`` ports per node that no running cluster on this host holds and nothing listens on, records
  it in its cluster file, and leaves a claim in the host's registry (``claims_dir``): a link named by the block to
  that file. ``down`` drops the claim; a claim whose cluster no longer runs is dropped by the next ``up``.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from shardyard.cli.children import CLUSTER_FILE, alive
from shardyard.errors import ClusterError

if TYPE_CHECKING:
    from shardyard.cli.cluster_info import ClusterInfo

START_LOCK = ".up.lock"
CLAIMS_DIR_ENV = "SHARDYARD_CLAIMS_DIR"
RENDEZVOUS_BASE = 29500
RENDEZVOUS_PER_NODE = 50
RENDEZVOUS_BASE_ENV = "SHARDYARD_RENDEZVOUS_PORT_BASE"
"""The lowest rendezvous port ``up`` may claim (default ``RENDEZVOUS_BASE``); it takes the first free block at or
above it."""
START_SLACK_S = 2.0
"""How much later than recorded a process may seem to have started and still be the one recorded: the kernel counts
a process's start in clock ticks from a boot time it gives in whole seconds."""


def process_started_at(pid: int) -> float | None:
    """When ``pid`` started, in seconds since the epoch; None where ``/proc`` does not say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
    except (OSError, StopIteration):
        return None
    ticks = int(stat.rsplit(")", 1)[-1].split()[19])  # field 22, starttime; fields 1 and 2 end at the ")"
    return int(boot.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")


def still_runs(pid: int | None, started_at: float | None) -> bool:
    """Whether the process recorded as ``pid``, started at ``started_at``, still runs."""
    if not pid or not alive(pid):
        return False
    began = process_started_at(pid)
    return began is None or started_at is None or began <= started_at + START_SLACK_S


def running(record: Mapping[str, Any]) -> bool:
    """Whether any process of the cluster a ``cluster.json`` describes still runs: one it started, its supervisor,
    or the ``up`` still starting it."""
    started = record.get("started") or {}
    processes = [(pid, started.get(name)) for name, pid in (record.get("pids") or {}).items()]
    processes += [(record.get("supervisor_pid"), started.get("supervisor"))]
    processes += [(record.get("starter_pid"), record.get("started_at"))]
    return any(still_runs(pid, at) for pid, at in processes)


def running_record(run_dir: Path) -> dict[str, Any] | None:
    """The cluster file of ``run_dir`` while its cluster runs; None when there is none or nothing of it runs."""
    try:
        record = json.loads((run_dir / CLUSTER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and running(record) else None


@contextlib.contextmanager
def starting(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s start lock while a cluster starts there; ClusterError at once if another ``up`` holds it,
    or if a cluster already runs from there."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / START_LOCK).open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise ClusterError(
                f"another `shardyard up` (pid {holder}) is starting a cluster in {run_dir}: wait for it, or start "
                "this one with another --run-dir"
            ) from None
        _write_holder(lock)
        if (record := running_record(run_dir)) is not None:
            raise ClusterError(
                f"a cluster is already running from {run_dir} (started {record.get('run_id') or 'earlier'}): stop it "
                "with `shardyard down`, or start this one with another --run-dir"
            )
        yield


def _write_holder(lock: IO[str]) -> None:
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()


def claims_dir() -> Path:
    """The host's registry of rendezvous claims: ``SHARDYARD_CLAIMS_DIR``, else ``shardyard-claims`` in the temporary
    folder, shared by every user of the host (sticky, as ``/tmp`` is: each removes only their own claims)."""
    named = os.environ.get(CLAIMS_DIR_ENV)
    folder = Path(named) if named else Path(tempfile.gettempdir()) / "shardyard-claims"
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            folder.chmod(0o1777)
    return folder


def floor(env: Mapping[str, str]) -> int:
    """The lowest rendezvous port to claim: ``SHARDYARD_RENDEZVOUS_PORT_BASE``, else ``RENDEZVOUS_BASE``."""
    value = env.get(RENDEZVOUS_BASE_ENV, "").strip()
    if not value:
        return RENDEZVOUS_BASE
    if not value.isdigit() or not 0 < int(value) < 65536 - 64 * RENDEZVOUS_PER_NODE:
        raise ClusterError(
            f"{RENDEZVOUS_BASE_ENV} is a port number below {65536 - 64 * RENDEZVOUS_PER_NODE}: {value!r}"
        )
    return int(value)


def claim_rendezvous(info: "ClusterInfo", nodes: int, env: Mapping[str, str]) -> None:
    """Give ``info``'s cluster the first block of rendezvous ports at or above ``floor(env)`` that no running
    cluster on this host claims and nothing listens on; record it in its cluster file and claim it."""
    count = max(nodes, 1) * RENDEZVOUS_PER_NODE
    registry = claims_dir()
    with _registry_lock(registry):
        taken = _live_claims(registry)
        base = floor(env)
        while base + count <= 65536:
            clash = next((end for start, end in taken if base < end and start < base + count), None)
            if clash is None and _all_free(base, count):
                break
            base = clash if clash is not None else base + RENDEZVOUS_PER_NODE
        else:
            raise ClusterError(f"no block of {count} free rendezvous ports above {floor(env)} on this host")
        info.rendezvous_base, info.rendezvous_ports = base, count
        info.save()
        link = registry / f"{base}-{count}-{os.getuid()}-{_folder_key(info.run_dir)}"
        link.unlink(missing_ok=True)
        link.symlink_to(Path(info.run_dir) / CLUSTER_FILE)


def release(run_dir: Path) -> None:
    """Drop the rendezvous claim of the cluster in ``run_dir`` (it stopped)."""
    key = _folder_key(str(run_dir.resolve()))
    with contextlib.suppress(OSError):
        for link in claims_dir().glob(f"*-*-{os.getuid()}-{key}"):
            link.unlink(missing_ok=True)


@contextlib.contextmanager
def _registry_lock(registry: Path) -> Iterator[None]:
    path = registry / ".lock"
    with path.open("a") as lock:
        with contextlib.suppress(OSError):
            path.chmod(0o666)
        fcntl.flock(lock, fcntl.LOCK_EX)  # held for milliseconds: one claim at a time on the host
        yield


def _live_claims(registry: Path) -> list[tuple[int, int]]:
    """The blocks, as [start, end), of claims whose cluster still runs (or whose file this user cannot read: held,
    to be safe); claims of this user's stopped clusters are dropped on the way."""
    taken = []
    for link in registry.iterdir():
        parts = link.name.split("-")
        if len(parts) != 4 or not (parts[0].isdigit() and parts[1].isdigit()):
            continue
        start, count = int(parts[0]), int(parts[1])
        try:
            record = json.loads(link.read_text())
            held = isinstance(record, dict) and record.get("rendezvous_base") == start and running(record)
        except FileNotFoundError:
            held = False
        except (OSError, ValueError):
            held = True
        if held:
            taken.append((start, start + count))
        elif parts[2] == str(os.getuid()):
            link.unlink(missing_ok=True)
    return sorted(taken)


def _all_free(base: int, count: int) -> bool:
    """Whether nothing listens on any port of [base, base + count) on this host right now."""
    for port in range(base, base + count):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                return False
    return True


def _folder_key(run_dir: str) -> str:
    return hashlib.sha256(run_dir.encode()).hexdigest()[:16]
