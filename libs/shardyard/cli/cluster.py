"""A local cluster as separate processes: its broker (the local Apache Kafka by default, see ``shardyard.broker``),
every service, and node agents with declared simulated GPUs. Its run folder holds ``cluster.json`` (its record:
``cluster_info``), every process's log and the local Kafka's log (``kafka/``), which the next ``up`` from the same
folder starts from."""

import argparse
import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from shardyard.broker.choice import Choice, choose
from shardyard.broker.local import start_broker
from shardyard.broker.process import BrokerProcess
from shardyard.bus.address import BOOTSTRAP_ENV, BROKER_ENV
from shardyard.cli import claims
from shardyard.cli import demo_data as demo
from shardyard.cli.children import (
    CLUSTER_FILE,
    Child,
    Children,
    PortPicker,
    Ports,
    pick_free_port,
    wait_ready,
)
from shardyard.cli.cluster_info import (
    ADMIN_PRINCIPAL,
    AGENT_PRINCIPAL,
    DEFAULT_NODES,
    REPLICAS,
    ClusterInfo,
    get_json,
)
from shardyard.cli.rundir import SHARD_LOGS
from shardyard.cli.shard_user import shard_user_fallback
from shardyard.cli.stopping import stop_processes
from shardyard.cli.team_files import cluster_secret, sealed_env, team_files
from shardyard.errors import ClusterError

SERVICES = ("queue", "scheduler", "resource-pool", "fault-manager", "accounting", "monitor")
ACCOUNTING_URL_TO = ("accounting", "monitor")
"""The services ``up`` gives ``--accounting-url``: the one that writes the database and the one that serves it."""
ELECTED = ("scheduler",)
AUTOSCALER = "autoscaler-0"


@dataclass(frozen=True)
class Autoscale:
    """``up --autoscale``: one autoscaler process with the ``local`` provider (``shardyard.autoscaler``), which adds
    agents of ``gpus`` (``MODEL:COUNT`` per node) for waiting jobs, up to ``max_nodes``, in rendezvous blocks ``up``
    claims after its nodes'; ``idle_s``, when given, is the scheduler's ``--reclaim-after-s``."""

    gpus: tuple[str, ...] = ("A100:1",)
    max_nodes: int = 2
    min_nodes: int = 0
    cooldown_s: float = 60.0
    min_lifetime_s: float | None = None
    idle_s: float | None = None

    @classmethod
    def of(cls, args: argparse.Namespace) -> "Autoscale":
        """From ``up``'s ``--autoscale-*`` options."""
        return cls(
            gpus=tuple(args.autoscale_gpus or cls.gpus),
            max_nodes=args.autoscale_max_nodes,
            min_nodes=args.autoscale_min_nodes,
            cooldown_s=args.autoscale_cooldown_s,
            min_lifetime_s=args.autoscale_min_lifetime_s,
            idle_s=args.autoscale_idle_s,
        )

    def argv(self, info: ClusterInfo, nodes: int) -> list[str]:
        """The autoscaler's options for ``info``'s cluster, whose ``up`` started ``nodes`` nodes."""
        base = info.rendezvous_base + nodes * claims.RENDEZVOUS_PER_NODE
        line = ["--provider", "local", "--run-dir", info.run_dir, "--rendezvous-port-base", str(base)]
        line += ["--max-nodes", str(self.max_nodes), "--min-nodes", str(self.min_nodes)]
        line += ["--cooldown-s", str(self.cooldown_s), *(arg for kind in self.gpus for arg in ("--gpus", kind))]
        return line + (["--min-lifetime-s", str(self.min_lifetime_s)] if self.min_lifetime_s is not None else [])

    def scheduler_argv(self) -> list[str]:
        return ["--reclaim-after-s", str(self.idle_s)] if self.idle_s is not None else []


def _module(service: str) -> str:
    return "shardyard." + service.replace("-", "_")


def _service_argv(service: str, name: str, extra: Sequence[str] = ()) -> Callable[[Ports], list[str]]:
    def argv(ports: Ports) -> list[str]:
        line = [sys.executable, "-m", _module(service), "--instance", name, *extra]
        if "http" in ports:
            line += ["--http-port", str(ports["http"])]
        return [*line, "--metrics-port", str(ports["metrics"])]

    return argv


def _agent_argv(index: int, gpus: str, info: ClusterInfo, extra: Sequence[str] = ()) -> Callable[[Ports], list[str]]:
    node_id = f"node-{index}"
    line = [
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
        str(info.rendezvous_base + index * claims.RENDEZVOUS_PER_NODE),
        "--rendezvous-port-count",
        str(claims.RENDEZVOUS_PER_NODE),
        "--log-dir",
        str(Path(info.run_dir) / SHARD_LOGS / info.run_id),
    ]
    for gpu in gpus.split("+"):
        line += ["--gpus", gpu]
    line += extra
    return lambda ports: [*line, "--metrics-port", str(ports["metrics"])]


def up(
    run_dir: Path,
    *,
    nodes: Sequence[str] = DEFAULT_NODES,
    replicas: int = REPLICAS,
    data_root: Path,
    bootstrap: str | None = None,
    broker: str | None = None,
    fresh: bool = False,
    timeout_s: float = 90.0,
    say: Callable[[str], None] = print,
    pick_port: PortPicker = pick_free_port,
    supervise: bool = True,
    accounting_url: str | None = None,
    demo_data: bool = False,
    queues_file: Path | None = None,
    credentials_file: Path | None = None,
    sign_events: bool = False,
    autoscale: Autoscale | None = None,
) -> ClusterInfo:
    """Start a local cluster; return once every service announced itself and every node is ALIVE. A process that
    exits before then fails ``up`` at once (its name, exit status and log's last lines), and the rest is stopped; one
    that lost a race for its port is first started again on fresh ones, up to ``PORT_RETRIES`` times. Once ready,
    ``supervise`` leaves a supervisor that restarts whatever dies (``cli.supervisor``). ``broker``, ``bootstrap``
    and ``fresh``: ``_broker_choice``. ``accounting_url``: default ``RUN_DIR/accounting.db``; ``demo_data``:
    ``demo.data_root``; ``autoscale``: ``Autoscale``; the rest: ``team_files``."""
    files = team_files(queues_file, credentials_file)
    with claims.starting(run_dir):
        choice = _broker_choice(broker, bootstrap, fresh=fresh)
        (logs := run_dir / "logs").mkdir(parents=True, exist_ok=True)
        demo.data_root(data_root, with_demo=demo_data, say=say)
        process: BrokerProcess | None = None
        info = ClusterInfo.new(run_dir, choice, data_root, accounting_url, cluster_secret(run_dir, sign_events))
        info.credentials_file = str(credentials_file.resolve()) if credentials_file else ""
        try:
            claims.claim_rendezvous(info, len(nodes) + (autoscale.max_nodes if autoscale else 0), os.environ)
            process, access = start_broker(choice, run_dir, logs, fresh=fresh, say=say, teams=_teams(credentials_file))
            info.access_dir = str(access.folder) if access is not None else ""
            info.record_broker(process)
            _create_topics(info.bootstrap, info.transport(ADMIN_PRINCIPAL))
            say(f"topics ready; starting {replicas} x {len(SERVICES)} service processes and {len(nodes)} node agents")
            children = _start_processes(
                info, logs, nodes=nodes, replicas=replicas, say=say, pick_port=pick_port, files=files, scale=autoscale
            )
            wait_ready(
                children,
                ready=_ready_saying(info, len(nodes), say),
                timeout_s=timeout_s,
                others={"broker": process.poll} if process is not None else {},
                say=say,
            )
        except BaseException:
            say("start-up failed: stopping the processes started so far")
            _abandon(run_dir, info, process)
            raise
        if supervise:
            start_supervisor(info, children, process, logs)
    say(_ready_line(info, len(nodes)))
    return info


def _ready_line(info: ClusterInfo, nodes: int) -> str:
    ports = f"{info.rendezvous_base}-{info.rendezvous_base + info.rendezvous_ports - 1}"
    return (
        f"cluster ready in {time.time() - info.started_at:.1f}s: {nodes} nodes, monitor {info.monitor_url}, "
        f"rendezvous ports {ports}"
    )


def _broker_choice(broker: str | None, bootstrap: str | None, *, fresh: bool) -> Choice:
    """The broker to run on: ``broker`` (``--broker``, ``shardyard.broker.choice``), an outside one at
    ``bootstrap``; ``fresh`` empties the local Kafka's log in ``RUN_DIR/kafka``, which another broker has none of."""
    choice = choose(broker, {**os.environ, BOOTSTRAP_ENV: bootstrap} if bootstrap else os.environ)
    if fresh and choice.kind == "external":
        raise ClusterError(f"--fresh empties the local broker's log; {choice.why} is not one to empty")
    return choice


def _create_topics(bootstrap: str, transport: Mapping[str, str]) -> None:
    import asyncio

    from shardyard.bus.admin import ensure_topics  # aiokafka: loaded by the commands that start a cluster only

    asyncio.run(ensure_topics(bootstrap, environ={**os.environ, **transport}))


def _teams(credentials_file: Path | None) -> list[str] | None:
    """The teams of a secured cluster (its credentials file's), each a principal of its broker; None: an open one."""
    if credentials_file is None:
        return None
    from shardyard.signing import read_credentials

    return sorted(read_credentials(credentials_file).teams)


def start_supervisor(info: ClusterInfo, children: Children, broker: BrokerProcess | None, logs: Path) -> None:
    """Write what ``up`` started to ``supervise.json`` and start the supervisor on it (see its module)."""
    from shardyard.cli.supervisor import Spec, Specs

    extra = {**_bus_env(info), "PYTHONUNBUFFERED": "1", **sealed_env(info.secret_file)}
    specs = Specs(info.run_dir, info.bootstrap)
    for name, child in children.started.items():
        argv = [str(a) for a in child.process.args]  # type: ignore[union-attr]
        specs.processes.append(Spec(name, argv, {**extra, **child.env}, str(child.log)))
    if broker is not None:
        specs.processes.append(Spec("broker", broker.argv, {}, str(logs / "broker.log")))
    specs.save()
    port = pick_free_port("supervisor", "metrics")
    with (logs / "supervisor.log").open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "shardyard.cli.supervisor", info.run_dir, str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    info.supervisor_pid, info.metrics_ports["supervisor"] = process.pid, port
    info.started["supervisor"] = time.time()
    info.save()


def _start_processes(
    info: ClusterInfo,
    logs: Path,
    *,
    nodes: Sequence[str],
    replicas: int,
    say: Callable[[str], None],
    pick_port: PortPicker,
    files: Mapping[str, Sequence[str]] | None = None,
    scale: Autoscale | None = None,
) -> Children:
    """Start every service's replicas, then one agent per node, all on ``info``'s broker; returns without waiting
    for any of them to be ready."""
    env = {**os.environ, **_bus_env(info), "PYTHONUNBUFFERED": "1", **sealed_env(info.secret_file)}
    children = Children(logs, env, pick_port, on_change=lambda started: _record(info, started))
    for service in SERVICES:
        roles = ("http", "metrics") if service == "monitor" else ("metrics",)
        for replica in range(replicas):
            name = f"{service}-{replica}"
            extra = ["--accounting-url", info.accounting_url] if service in ACCOUNTING_URL_TO else []
            extra += (files or {}).get(service, [])
            extra += scale.scheduler_argv() if scale is not None and service == "scheduler" else []
            if service == "monitor":  # one dead letter a bad record: each replica writes those of its share
                extra += ["--dead-letter-share", f"{replica}/{replicas}"]
            children.start(name, _service_argv(service, name, extra), roles, info.transport(service))
    shard_user = shard_user_fallback(env, say)
    for index, gpus in enumerate(nodes):
        argv = _agent_argv(index, gpus, info, shard_user)
        children.start(f"node-{index}", argv, ("metrics",), info.transport(AGENT_PRINCIPAL))
    if scale is not None:  # started last: its nodes' rendezvous blocks follow the nodes'
        argv = _service_argv("autoscaler", AUTOSCALER, scale.argv(info, len(nodes)))
        children.start(AUTOSCALER, argv, ("metrics",), info.transport("autoscaler"))
    return children


def _bus_env(info: ClusterInfo) -> dict[str, str]:
    """How every process of the cluster reaches its broker, and which broker it is (``bus.quirks``)."""
    return {BOOTSTRAP_ENV: info.bootstrap, BROKER_ENV: info.broker}


def _abandon(run_dir: Path, info: ClusterInfo, broker: BrokerProcess | None) -> None:
    """Undo a start-up that failed: stop what started (by the pids recorded so far) and forget the cluster, its
    file (only its own: ``claims.starting`` let no other start here) and its rendezvous ports."""
    stop_processes(info.pids)
    _forget(run_dir, info.run_id)
    if broker is not None:
        broker.stop()


def _record(info: ClusterInfo, started: Mapping[str, Child]) -> None:
    """The cluster file after a process (re)started: every pid (``down`` stops them, even of a half-started
    cluster), each process's metrics port, and the monitors' addresses in replica order."""
    for name, child in started.items():
        if info.pids.get(name) != child.process.pid:
            info.started[name] = time.time()
        info.pids[name], info.metrics_ports[name] = child.process.pid, child.ports["metrics"]
    info.monitor_urls = [f"http://127.0.0.1:{c.ports['http']}" for c in started.values() if "http" in c.ports]
    info.monitor_url = info.monitor_urls[0] if info.monitor_urls else ""
    info.save()


def _missing(info: ClusterInfo, *, expected_nodes: int) -> str | None:
    """What the cluster still waits for: a service to announce itself, an elected one's leader, a node to be ALIVE
    (the monitor says); None once nothing. Short timeouts: between two asks, ``up`` looks at its children."""
    try:
        answer = get_json(f"{info.monitor_url}/api/services", timeout_s=0.5)
        services = {s["service"] for s in answer["services"]}
        nodes = get_json(f"{info.monitor_url}/api/nodes", timeout_s=0.5)["nodes"]
    except (urllib.error.URLError, OSError, ValueError):
        return "the monitor to answer"  # not listening yet
    alive = sum(1 for n in nodes if n["status"] == "ALIVE")
    waiting = [s for s in SERVICES if s not in services]
    waiting += [f"a {s} leader" for s in ELECTED if s in services and s not in answer["leaders"]]
    if alive < expected_nodes:
        waiting.append(f"nodes ({alive}/{expected_nodes} ALIVE)")
    return ", ".join(waiting) or None


WAITING_SAID_EVERY_S = 10.0
"""While ``up`` waits for its processes, it says what for this often: a start-up is never silent for long."""


def _ready_saying(info: ClusterInfo, expected_nodes: int, say: Callable[[str], None]) -> Callable[[], bool]:
    """``_ready``, saying what is still awaited every ``WAITING_SAID_EVERY_S``."""
    began = last = time.monotonic()

    def ready() -> bool:
        nonlocal last
        missing = _missing(info, expected_nodes=expected_nodes)
        if missing is not None and time.monotonic() - last >= WAITING_SAID_EVERY_S:
            last = time.monotonic()
            say(f"waiting for {missing} ({last - began:.0f}s)")
        return missing is None

    return ready


def down(run_dir: Path, *, timeout_s: float = 15.0, say: Callable[[str], None] = print) -> None:
    """Stop every process of the cluster: the supervisor (nothing is restarted any more), then agents (they stop
    their shards), then services, then the broker."""
    info = ClusterInfo.load(run_dir)
    if info.supervisor_pid is not None:
        stop_processes({"supervisor": info.supervisor_pid}, timeout_s=5.0)
        info = ClusterInfo.load(run_dir)  # it may have started one again just before it stopped
    stop_processes(info.pids, timeout_s=timeout_s)
    _forget(run_dir, info.run_id)
    say(f"cluster in {run_dir} stopped")


def _forget(run_dir: Path, run_id: str) -> None:
    """Remove the cluster file of the cluster run ``run_id`` (not another's, written since) and its port claim."""
    with contextlib.suppress(ClusterError):
        if ClusterInfo.load(run_dir).run_id == run_id:
            (run_dir / CLUSTER_FILE).unlink(missing_ok=True)
    claims.release(run_dir)
