"""The supervisor ``shardyard up`` leaves behind: it restarts any process of the cluster that dies, with backoff, the
way compose's ``restart: unless-stopped`` or systemd's ``Restart=on-failure`` would.

``up`` starts every process itself (so it can fail at once, naming the one that exited during start-up), then writes
what it started to ``supervise.json`` in the run folder (each process's command line and log) and starts this
module as a process of its own: ``python -m shardyard.cli.supervisor RUN_DIR``. Every ``CHECK_S`` it looks at each
process (by pid: those ``up`` started are not its children). One that is gone is started again after its backoff:
``BACKOFF_S`` doubling per restart up to ``MAX_BACKOFF_S``, back to the first once a process has run for
``STEADY_S``. A restart is logged (``logs/supervisor.log``), counted in ``cluster.json`` (``restarts``, which
``shardyard ps`` shows) and on the supervisor's own metrics port as ``shardyard_process_restarts_total{process}``.

The embedded broker keeps its log in memory: one that is restarted comes back empty, on the same port. The
supervisor then creates the catalogue's topics again at once, so that producers and the services' consumers find
them, and stops every other process, to start it again: each rebuilds its state from the new log, as after any
restart. Everything the old log held (jobs, their history, committed offsets) is gone, see the README; the shards
of the jobs it held are stopped with their agents, and their checkpoints stay on disk.

``down`` stops the supervisor first (SIGTERM: it exits and starts nothing more), then the cluster."""

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, start_http_server

from shardyard.bus.admin import ensure_topics
from shardyard.cli.children import CLUSTER_FILE, alive, exit_text, save_json

SPECS_FILE = "supervise.json"
CHECK_S = 0.5
BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STEADY_S = 60.0
log = logging.getLogger("shardyard.supervisor")


@dataclass(frozen=True)
class Spec:
    """How to start one process again: its command line, the variables ``up`` added to its environment, its log."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: str


@dataclass
class Specs:
    run_dir: str
    bootstrap: str
    processes: list[Spec] = field(default_factory=list)

    def save(self) -> None:
        save_json(Path(self.run_dir) / SPECS_FILE, asdict(self))

    @classmethod
    def load(cls, run_dir: Path) -> "Specs":
        raw = json.loads((run_dir / SPECS_FILE).read_text())
        return cls(raw["run_dir"], raw["bootstrap"], [Spec(**p) for p in raw["processes"]])


@dataclass
class Watched:
    spec: Spec
    pid: int
    started: float
    restarts: int = 0
    level: int = 0
    """Restarts since it last ran ``STEADY_S``: the backoff doubles with each."""
    due: float | None = None
    """When it is started again, once it was found gone."""
    process: subprocess.Popen[bytes] | None = None

    def backoff(self) -> float:
        return min(MAX_BACKOFF_S, BACKOFF_S * 2**self.level)


def fresh_instance(argv: list[str], name: str) -> list[str]:
    """An agent's command line with a new ``--instance``: a restarted agent is a new instance of its node (the pool
    and the scheduler tell a restart by it). A service replica keeps its name, which is its instance."""
    if not name.startswith("node-") or "--instance" not in argv:
        return argv
    at = argv.index("--instance") + 1
    return [*argv[:at], f"{name}-{int(time.time() * 1000)}", *argv[at + 1 :]]


class Supervisor:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.specs = Specs.load(run_dir)
        pids = json.loads((run_dir / CLUSTER_FILE).read_text())["pids"]
        now = time.monotonic()
        self.watched = {s.name: Watched(s, pids[s.name], now) for s in self.specs.processes if s.name in pids}
        self.registry = CollectorRegistry()
        self.restarts = Counter(
            "shardyard_process_restarts",
            "Processes of the local cluster the supervisor started again after they died",
            ["process"],
            registry=self.registry,
        )
        self.stopping = False

    def serve_metrics(self, port: int) -> None:
        start_http_server(port, addr="127.0.0.1", registry=self.registry)

    def tick(self) -> None:
        """One look at every process: start the ones whose backoff ran out, note the ones that just died."""
        now = time.monotonic()
        for name, entry in self.watched.items():
            if self.stopping:
                return
            if entry.due is None:
                # A process this supervisor started is its child (poll reaps it); one ``up`` started is not.
                code = entry.process.poll() if entry.process is not None else None
                if code is None and alive(entry.pid):
                    if now - entry.started >= STEADY_S:
                        entry.level = 0  # it ran steadily: a next death is restarted after the first backoff
                    continue
                wait = entry.backoff()
                entry.due = now + wait
                said = exit_text(code) if code is not None else "gone"
                log.warning("%s (pid %d) died (%s): starting it again in %.1f s", name, entry.pid, said, wait)
            elif now >= entry.due:
                self._restart(entry)

    def _restart(self, entry: Watched) -> None:
        spec = entry.spec
        with open(spec.log, "ab") as out:
            entry.process = subprocess.Popen(
                fresh_instance(spec.argv, spec.name),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **spec.env},
                start_new_session=True,
            )
        entry.pid, entry.started, entry.due = entry.process.pid, time.monotonic(), None
        entry.restarts += 1
        entry.level += 1
        self.restarts.labels(spec.name).inc()
        self._record(spec.name, entry.pid)
        log.warning("started %s again: pid %d (restart %d)", spec.name, entry.pid, entry.restarts)
        if spec.name == "broker":
            self._topics_again()

    def _topics_again(self) -> None:
        """A restarted embedded broker is empty: create the catalogue's topics at once (it listens within a second)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not self.stopping:
            try:
                asyncio.run(asyncio.wait_for(ensure_topics(self.specs.bootstrap), 10))
            except Exception as exc:  # not listening yet
                log.info("the restarted broker does not answer yet: %s", exc)
                time.sleep(0.5)
                continue
            log.warning("the broker came back empty (its log is in memory): the catalogue's topics were created again")
            self._start_over()
            return

    def _start_over(self) -> None:
        """After the broker came back empty, every other process is stopped (SIGTERM: an agent stops its shards,
        their checkpoints stay) and started again at once, to rebuild its state from the new log: what each held
        (jobs, leases, terms, an agent's attempts) is of a log that is gone."""
        for name, entry in self.watched.items():
            if name == "broker" or entry.due is not None or not alive(entry.pid):
                continue
            entry.level = 0  # no backoff: nothing is wrong with it
            log.warning("stopping %s (pid %d) to start it again on the empty broker", name, entry.pid)
            with contextlib.suppress(OSError):
                os.kill(entry.pid, signal.SIGTERM)

    def _record(self, name: str, pid: int) -> None:
        """The restart in the cluster file (``ClusterInfo``'s fields ``pids``, ``restarts``, ``started``)."""
        path = self.run_dir / CLUSTER_FILE
        with contextlib.suppress(OSError, ValueError):  # ``down`` removed the file: nothing to keep true any more
            info = json.loads(path.read_text())
            info["pids"][name] = pid
            info.setdefault("restarts", {})[name] = info.get("restarts", {}).get(name, 0) + 1
            info.setdefault("started", {})[name] = time.time()
            save_json(path, info)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    run_dir = Path(argv[0])
    supervisor = Supervisor(run_dir)
    if len(argv) > 1:
        supervisor.serve_metrics(int(argv[1]))

    def stop(_signum: int, _frame: object) -> None:
        supervisor.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("supervising %d processes of %s", len(supervisor.watched), run_dir)
    while not supervisor.stopping:
        supervisor.tick()
        time.sleep(CHECK_S)
    log.info("stopped: the cluster's processes are no longer restarted")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
