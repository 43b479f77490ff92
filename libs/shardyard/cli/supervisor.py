"""The supervisor ``shardyard up`` leaves behind: it restarts any process of the cluster that dies, with backoff, the
way compose's ``restart: unless-stopped`` or systemd's ``Restart=on-failure`` would.

``up`` starts every process itself (so it can fail at once, naming the one that exited during start-up), then writes
what it started to ``supervise.json`` in the run folder (each process's command line and log) and starts this
module as a process of its own: ``python -m shardyard.cli.supervisor RUN_DIR``. Every ``CHECK_S`` it looks at each
process (by pid: those ``up`` started are not its children). One that is gone is started again after its backoff:
``BACKOFF_S`` doubling per restart up to ``MAX_BACKOFF_S``, back to the first once a process has run for
``STEADY_S``. A restart is logged (``logs/supervisor.log``), counted in ``cluster.json`` (``restarts``, which
``shardyard ps`` shows) and on the supervisor's own metrics port as ``shardyard_process_restarts_total{process}``.

The local Apache Kafka keeps its log on disk: one that died is started again like any other process, on the same
ports and folder, and comes back with every record it acknowledged; the others reconnect and go on.

The embedded broker, by default, keeps its log in memory: one that is restarted comes back empty, on the same port.
So when it dies, the supervisor stops every other process first, starts the broker once they are gone, creates the
catalogue's topics at once, and then starts the others again: the cluster starts over as ``up`` started it, each
process rebuilding its state from the new log (see ``_broker_down``). Everything the old log held (jobs, their history,
committed offsets) is gone, see docs/operators/running.md; the shards of its jobs are stopped with their agents, and
their checkpoints stay on disk.

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

from shardyard.broker.embedded import in_memory
from shardyard.bus.admin import ensure_topics
from shardyard.cli.children import CLUSTER_FILE, alive, exit_text, save_json

SPECS_FILE = "supervise.json"
CHECK_S = 0.5
BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STEADY_S = 60.0
STOP_OTHERS_S = 20.0
"""How long the other processes get to stop once an in-memory broker died, before it is started again anyway."""
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
        self.others_stop_by: float | None = None
        """While an in-memory broker is down: when the others, stopped, are killed if still there."""

    def serve_metrics(self, port: int) -> None:
        start_http_server(port, addr="127.0.0.1", registry=self.registry)

    def tick(self) -> None:
        """One look at every process: start the ones whose backoff ran out, note the ones that just died. While an
        in-memory broker is down, the others are stopped and none is started (see ``_broker_down``)."""
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
                if name == "broker" and in_memory(entry.spec.argv):
                    self._broker_down(now)
            elif self.others_stop_by is not None and name != "broker":
                continue  # started once the broker is back
            elif now >= entry.due and (name != "broker" or self._others_stopped(now)):
                self._restart(entry)

    def _broker_down(self, now: float) -> None:
        """An in-memory broker died: it comes back empty, and what every other process holds is of the log it lost
        (jobs, leases, leadership terms, an agent's attempts; left in place, a forgotten job showed RUNNING for ever
        and a new one reusing its id got no answer). So the whole cluster starts over, as ``up`` started it: the
        others are stopped (SIGTERM: an agent stops its shards, their checkpoints stay), the broker is started once
        they are gone (``SIGKILL`` after ``STOP_OTHERS_S``), then the others, without backoff. None of them meets
        the new broker before it is empty and whole. (Stopped after it instead, an old pool replica joined its group
        on the new broker just before its SIGTERM, and twice the new one never joined: no node state for minutes.)"""
        self.others_stop_by = now + STOP_OTHERS_S
        for name, entry in self.watched.items():
            if name == "broker" or entry.due is not None or not alive(entry.pid):
                continue
            log.warning(
                "stopping %s (pid %d): the broker comes back empty, and the cluster starts over", name, entry.pid
            )
            with contextlib.suppress(OSError):
                os.kill(entry.pid, signal.SIGTERM)

    def _others_stopped(self, now: float) -> bool:
        """Whether the broker may start: no other process is left from before it died."""
        if self.others_stop_by is None:
            return True
        left = [e for n, e in self.watched.items() if n != "broker" and e.due is None and alive(e.pid)]
        if left and now < self.others_stop_by:
            return False
        for entry in left:
            log.warning("%s (pid %d) did not stop in %.0f s: killed", entry.spec.name, entry.pid, STOP_OTHERS_S)
            with contextlib.suppress(OSError):
                os.kill(entry.pid, signal.SIGKILL)
        return True

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
        if spec.name == "broker" and in_memory(spec.argv):
            self._topics_again()  # a durable one (SHARDYARD_BROKER_STORAGE) comes back with its log
            for other in self.watched.values():
                if other is not entry and other.due is not None:
                    other.due, other.level = time.monotonic(), 0  # the cluster starts over: nothing is wrong with it
            self.others_stop_by = None

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
            return

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
