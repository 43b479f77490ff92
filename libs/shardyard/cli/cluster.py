"""A local cluster as separate processes: the embedded broker (unless an outside Kafka is named), every service,
and node agents with declared simulated GPUs. Its run folder holds ``cluster.json`` and every process's log."""

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from shardyard.bus.admin import ensure_topics
from shardyard.embedded import EmbeddedBroker, free_port
from shardyard.errors import ClusterError

SERVICES = ("queue", "scheduler", "resource-pool", "fault-manager", "monitor")
REPLICAS = 2
"""Processes per service: the scheduler's standby is warm (it follows the log); the queue's replicas split the jobs
by submission, the resource pool's the nodes and the fault manager's the jobs by their shard events; both monitors
serve the status API."""
ELECTED = ("scheduler",)
DEFAULT_NODES = ("A100:1", "A100:1", "V100:2")
CLUSTER_FILE = "cluster.json"
RENDEZVOUS_BASE = 29500
RENDEZVOUS_PER_NODE = 50


@dataclass
class ClusterInfo:
    run_dir: str
    bootstrap: str
    monitor_url: str
    data_root: str
    embedded_broker: bool
    started_at: float
    pids: dict[str, int] = field(default_factory=dict)
    monitor_urls: list[str] = field(default_factory=list)
    """Every monitor replica's address; ``monitor_url`` is the first. ``live()`` picks one that answers."""
    metrics_ports: dict[str, int] = field(default_factory=dict)
    """Each process's own Prometheus metrics port on 127.0.0.1 (``--metrics-port``), by process name."""

    def live(self) -> "ClusterInfo":
        """This cluster, its ``monitor_url`` the first monitor replica that answers (another may have died)."""
        for url in self.monitor_urls:
            try:
                get_json(f"{url}/healthz", timeout_s=0.5)
            except (urllib.error.URLError, OSError, ValueError):
                continue
            return replace(self, monitor_url=url)
        return self

    def save(self) -> None:
        path = Path(self.run_dir) / CLUSTER_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, run_dir: Path) -> "ClusterInfo":
        path = run_dir / CLUSTER_FILE
        try:
            return cls(**json.loads(path.read_text()))
        except FileNotFoundError as exc:
            raise ClusterError(f"no cluster is running from {run_dir} (start one with `shardyard up`)") from exc


def get_json(url: str, timeout_s: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


def _module(service: str) -> str:
    return "shardyard." + service.replace("-", "_")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _spawn(name: str, argv: Sequence[str], logs: Path, env: dict[str, str]) -> int:
    log = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child, closed below
    try:
        process = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    finally:
        log.close()
    return process.pid


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def up(
    run_dir: Path,
    *,
    nodes: Sequence[str] = DEFAULT_NODES,
    data_root: Path,
    bootstrap: str | None = None,
    timeout_s: float = 90.0,
    say: Callable[[str], None] = print,
) -> ClusterInfo:
    """Start a local cluster and return once every service announced itself and every node is ALIVE."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(ClusterError):
        existing = ClusterInfo.load(run_dir)
        if any(_alive(pid) for pid in existing.pids.values()):
            raise ClusterError(f"a cluster is already running from {run_dir}; stop it with `shardyard down`")
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    data_root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    pids: dict[str, int] = {}
    embedded = bootstrap is None
    if bootstrap is None:
        broker = EmbeddedBroker(log_path=logs / "broker.log").start()
        bootstrap = broker.bootstrap
        assert broker.pid is not None
        pids["broker"] = broker.pid
        say(f"embedded broker on {bootstrap}")
    monitor_ports = [free_port() for _ in range(REPLICAS)]
    monitor_urls = [f"http://127.0.0.1:{port}" for port in monitor_ports]
    info = ClusterInfo(
        run_dir=str(run_dir.resolve()),
        bootstrap=bootstrap,
        monitor_url=monitor_urls[0],
        monitor_urls=monitor_urls,
        data_root=str(data_root.resolve()),
        embedded_broker=embedded,
        started_at=time.time(),
        pids=pids,
    )
    metrics_ports = info.metrics_ports
    info.save()
    try:
        asyncio.run(ensure_topics(bootstrap))
        env = {**os.environ, "SHARDYARD_KAFKA_BOOTSTRAP": bootstrap, "PYTHONUNBUFFERED": "1"}
        for service in SERVICES:
            for replica in range(REPLICAS):
                name = f"{service}-{replica}"
                argv = [sys.executable, "-m", _module(service), "--instance", name]
                if service == "monitor":
                    argv += ["--http-port", str(monitor_ports[replica])]
                metrics_ports[name] = free_port()
                argv += ["--metrics-port", str(metrics_ports[name])]
                pids[name] = _spawn(name, argv, logs, env)
        for index, gpus in enumerate(nodes):
            node_id = f"node-{index}"
            argv = [
                sys.executable,
                "-m",
                "shardyard.node_agent",
                "--node-id",
                node_id,
                "--instance",
                f"{node_id}-{int(time.time())}",
                "--mounts",
                f"/data={info.data_root}",
                # Every local agent mounts the same folder: to placement it is a shared path, not local disk.
                "--shared-mounts",
                "/data",
                "--cpu-cores",
                "16",
                "--memory-gib",
                "128",
                "--rendezvous-port-base",
                str(RENDEZVOUS_BASE + index * RENDEZVOUS_PER_NODE),
                "--rendezvous-port-count",
                str(RENDEZVOUS_PER_NODE),
                "--log-dir",
                str(logs / "shards"),
            ]
            for gpu in gpus.split("+"):
                argv += ["--gpus", gpu]
            metrics_ports[node_id] = free_port()
            argv += ["--metrics-port", str(metrics_ports[node_id])]
            pids[node_id] = _spawn(node_id, argv, logs, env)
        info.save()
        _wait_ready(info, expected_nodes=len(nodes), timeout_s=timeout_s)
    except BaseException:
        down(run_dir, say=lambda _m: None)
        raise
    say(f"cluster ready in {time.monotonic() - started:.1f}s: {len(nodes)} nodes, monitor {info.monitor_url}")
    return info


def _wait_ready(info: ClusterInfo, *, expected_nodes: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    logs = Path(info.run_dir) / "logs"
    while True:
        for name, pid in info.pids.items():
            if not _alive(pid):
                raise ClusterError(f"{name} exited during start-up; its log ends:\n{_log_tail(logs / f'{name}.log')}")
        try:
            answer = get_json(f"{info.monitor_url}/api/services")
            services = {s["service"] for s in answer["services"]}
            nodes = get_json(f"{info.monitor_url}/api/nodes")["nodes"]
            alive = sum(1 for n in nodes if n["status"] == "ALIVE")
            if set(SERVICES) <= services and set(ELECTED) <= set(answer["leaders"]) and alive >= expected_nodes:
                return
        except (urllib.error.URLError, OSError, ValueError):
            pass  # the monitor is not listening yet
        if time.monotonic() > deadline:
            raise ClusterError(f"the cluster was not ready within {timeout_s:.0f}s; logs are in {logs}")
        time.sleep(0.2)


def down(run_dir: Path, *, timeout_s: float = 15.0, say: Callable[[str], None] = print) -> None:
    """Stop every process of the cluster: agents first (they stop their shards), then services, then the broker."""
    info = ClusterInfo.load(run_dir)
    order = sorted(info.pids, key=lambda n: (n == "broker", not n.startswith("node-")))
    for group in ([n for n in order if n.startswith("node-")], [n for n in order if not n.startswith("node-")]):
        for name in group:
            with contextlib.suppress(ProcessLookupError):
                os.kill(info.pids[name], signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while any(_alive(info.pids[n]) for n in group) and time.monotonic() < deadline:
            _reap()
            time.sleep(0.1)
        for name in group:
            if _alive(info.pids[name]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(info.pids[name], signal.SIGKILL)
    _reap()
    (run_dir / CLUSTER_FILE).unlink(missing_ok=True)
    say(f"cluster in {run_dir} stopped")


def _reap() -> None:
    """Collect exited children when ``up`` and ``down`` run in one process (the demo)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
