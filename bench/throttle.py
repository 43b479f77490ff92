"""Slowing one process down for real, for tests and benchmarks only (fault injection: a straggler).

The process is held to a share of the CPU it was getting, by the kernel, as a slow GPU or a noisy neighbour would
hold it: nothing in Shardyard is told, and the agent and the shard behave as they would on slow hardware.

- **cgroup v2** (``/sys/fs/cgroup/cgroup.controllers`` lists ``cpu``): a child group of the cgroup root with
  ``cpu.max`` set, and the process moved into it;
- **cgroup v1** (a ``cpu`` hierarchy at ``/sys/fs/cgroup/cpu``): the same with ``cpu.cfs_quota_us`` and
  ``cpu.cfs_period_us``;
- **else** (no writable cgroup: an unprivileged container): ``SIGSTOP``/``SIGCONT`` in 100 ms periods, the process
  stopped for the share it must lose (what CFS bandwidth control does, at a coarser grain).

``factor`` is the speed kept: 0.5 halves it. The quota is that share of the CPU the process used over the last
second (measured here), so that it slows to half on a host where it already shares its cores.
"""

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_rate(pid: int, over_s: float = 1.0) -> float:
    """Cores the process used over the last ``over_s`` (measured now)."""
    before, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(over_s)
    return (cpu_seconds(pid) - before) / (time.monotonic() - t0)


def _v2() -> bool:
    controllers = ROOT / "cgroup.controllers"
    return controllers.exists() and "cpu" in controllers.read_text(errors="replace").split()


def _group(name: str) -> tuple[Path, str] | None:
    """A new cgroup for ``name`` and how it is limited (``v2`` or ``v1``); None where none can be made."""
    path, kind = (ROOT / name, "v2") if _v2() else (ROOT / "cpu" / name, "v1")
    try:
        if kind == "v2":
            with contextlib.suppress(OSError):  # the root may hand the cpu controller down already
                (ROOT / "cgroup.subtree_control").write_text("+cpu")
        path.mkdir(exist_ok=True)
    except OSError:
        return None
    return path, kind


def _limit(path: Path, kind: str, cores: float) -> None:
    quota = max(1000, int(cores * PERIOD_US))
    if kind == "v2":
        (path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    else:
        (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (path / "cpu.cfs_quota_us").write_text(str(quota))


@contextlib.contextmanager
def throttled(pid: int, factor: float) -> Iterator[str]:
    """Within: ``pid`` runs at ``factor`` of its speed (see the module's doc); yields how (``cgroup-v2``,
    ``cgroup-v1`` or ``sigstop``). The process may end meanwhile; the limit goes with the block."""
    cores = cpu_rate(pid) * factor
    made = _group(f"shardyard-slow-{pid}")
    if made is not None:
        path, kind = made
        try:
            _limit(path, kind, cores)
            (path / "cgroup.procs").write_text(str(pid))
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            made = None
    if made is None:
        with _stopping(pid, factor):
            yield "sigstop"
        return
    path, kind = made
    try:
        yield f"cgroup-{kind}"
    finally:
        _release(path, kind)


def _release(path: Path, kind: str) -> None:
    """Lift the limit: what is still in the group goes back to the root, then the group is removed."""
    parent = ROOT if kind == "v2" else ROOT / "cpu"
    with contextlib.suppress(OSError):
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (parent / "cgroup.procs").write_text(pid)
    with contextlib.suppress(OSError):
        path.rmdir()


@contextlib.contextmanager
def _stopping(pid: int, factor: float) -> Iterator[None]:
    done = threading.Event()
    stop_s = (1.0 - factor) * PERIOD_US / 1e6

    def cycle() -> None:
        while not done.is_set():
            try:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(stop_s)
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                return
            done.wait(PERIOD_US / 1e6 - stop_s)

    thread = threading.Thread(target=cycle, name=f"throttle-{pid}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=2)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
