"""The processes ``shardyard up`` starts, watched through their own handles until the cluster is ready.

Each one's ports are picked free (``free_port``) but bound only by the child, so another process may take one in
between: a child that exits with the OS's "address already in use" in its log is started again on fresh ports (up
to ``PORT_RETRIES`` times). Any other child that exits during start-up fails the wait at once, named with its exit
status and the last lines of its log. ``Popen.poll`` sees a dead child whether or not it was reaped yet; a zombie
answers ``kill(pid, 0)`` as if it lived.
"""

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shardyard.broker.ports import free_port
from shardyard.errors import ClusterError

CLUSTER_FILE = "cluster.json"
"""The run folder's record of the cluster (``cluster.ClusterInfo``): what ``up`` started and the supervisor keeps."""
PORT_RETRIES = 3
"""How often one process is started again on fresh ports after it lost a race for one."""
PORT_TAKEN = "address already in use"
"""What a lost port race leaves in a child's log, matched case-insensitively: the OS's EADDRINUSE text, as aiohttp
(a monitor's status API) and the metrics server (every process) both report it."""
TAIL_LINES = 15

Ports = dict[str, int]
"""A child's ports by role: ``metrics`` (every process), ``http`` (a monitor's status API)."""
PortPicker = Callable[[str, str], int]
"""(process name, port role) -> a port to give it. Tests pick taken ones."""


def save_json(path: Path, data: object) -> None:
    """Write ``data`` to ``path`` whole or not at all (a reader never sees half a file): the cluster file, the
    supervisor's specs."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def pick_free_port(_name: str, _role: str) -> int:
    return free_port()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs, for a process that is not this one's child (``shardyard down`` from another shell):
    a zombie, dead but not yet reaped, is not alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: kill(pid, 0) is all there is
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


def exit_text(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def log_text(path: Path, start: int = 0) -> str:
    """``path`` from byte ``start`` on (a log that earlier runs appended to); empty when it cannot be read."""
    try:
        with path.open("rb") as log:
            log.seek(start)
            return log.read().decode(errors="replace")
    except OSError:
        return ""


def log_tail(path: Path, start: int = 0, lines: int = TAIL_LINES) -> str:
    return "\n".join(log_text(path, start).splitlines()[-lines:]) or "(nothing)"


@dataclass
class Child:
    """One process as ``up`` started it, and how to build its command line for other ports."""

    name: str
    argv: Callable[[Ports], list[str]]
    ports: Ports
    log: Path
    process: subprocess.Popen[bytes]
    log_from: int
    env: Mapping[str, str]
    """What this process's environment adds to the cluster's (its broker principal's credentials)."""
    """The log's size when this process started: what follows is its own (the log is appended to)."""
    restarts: int = 0

    def lost_port_race(self) -> bool:
        return PORT_TAKEN in log_text(self.log, self.log_from).lower()


@dataclass
class Children:
    """The cluster's processes; ``on_change`` hears of every (re)start, to keep the cluster file true."""

    logs: Path
    env: Mapping[str, str]
    pick_port: PortPicker = pick_free_port
    on_change: Callable[[Mapping[str, Child]], None] = lambda _started: None
    started: dict[str, Child] = field(default_factory=dict)
    _given: set[int] = field(default_factory=set)

    def start(
        self, name: str, argv: Callable[[Ports], list[str]], roles: Sequence[str], env: Mapping[str, str] | None = None
    ) -> Child:
        child = self._spawn(name, argv, {role: self._port(name, role) for role in roles}, env or {})
        self.started[name] = child
        self.on_change(self.started)
        return child

    def check(self, say: Callable[[str], None]) -> None:
        """Raise ClusterError naming the first child that exited, unless it lost a port race with retries left:
        then it is started again on fresh ports."""
        for name, child in list(self.started.items()):
            code = child.process.poll()
            if code is None:
                continue
            if child.restarts < PORT_RETRIES and child.lost_port_race():
                fresh = {role: self._port(name, role) for role in child.ports}
                say(f"{name} lost a race for a port ({child.ports}): starting it again on {fresh}")
                again = self._spawn(name, child.argv, fresh, child.env)
                again.restarts = child.restarts + 1
                self.started[name] = again
                self.on_change(self.started)
                continue
            raise ClusterError(
                f"{name} exited during start-up ({exit_text(code)}); its log {child.log} ends:\n"
                f"{log_tail(child.log, child.log_from)}"
            )

    def _port(self, name: str, role: str) -> int:
        """A port for ``name``'s ``role``; not one already given to another process of this cluster, when the
        picker offers another within a few tries."""
        for _try in range(10):
            port = self.pick_port(name, role)
            if port not in self._given:
                break
        self._given.add(port)
        return port

    def _spawn(self, name: str, argv: Callable[[Ports], list[str]], ports: Ports, env: Mapping[str, str]) -> Child:
        path = self.logs / f"{name}.log"
        with path.open("ab") as log:  # the child keeps its own descriptor of it
            log_from = log.tell()
            process = subprocess.Popen(
                argv(ports),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**self.env, **env},
                start_new_session=True,
            )
        return Child(name, argv, ports, path, process, log_from, env)


def wait_ready(
    children: Children,
    *,
    ready: Callable[[], bool],
    timeout_s: float,
    others: Mapping[str, Callable[[], int | None]] | None = None,
    say: Callable[[str], None] = print,
    poll_s: float = 0.1,
) -> None:
    """Return once ``ready``. A child that exits first (or one of ``others``, name -> its exit status or None while
    it runs, which cannot be restarted: the embedded broker) fails the wait within ``poll_s`` plus one ``ready`` of
    its death; ClusterError at ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        children.check(say)
        for name, poll in (others or {}).items():
            if (code := poll()) is not None:
                raise ClusterError(
                    f"{name} exited during start-up ({exit_text(code)}); its log ends:\n"
                    f"{log_tail(children.logs / f'{name}.log')}"
                )
        if ready():
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"the cluster was not ready within {timeout_s:.0f}s; logs are in {children.logs}")
        time.sleep(poll_s)
