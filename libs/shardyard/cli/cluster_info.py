"""The record of a local cluster, ``RUN_DIR/cluster.json``: what ``up`` started, where its broker and monitors
answer, and how a command speaks to them (``ClusterInfo``); and reading the monitor's API."""

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardyard.cli.children import CLUSTER_FILE, save_json
from shardyard.cli.inert import inert_json
from shardyard.cli.rundir import new_run_id
from shardyard.errors import ClusterError
from shardyard.jobdb.urls import default_url

if TYPE_CHECKING:
    from shardyard.broker.choice import Choice
    from shardyard.broker.process import BrokerProcess

REPLICAS = 2
"""Processes per service ``up`` starts: the scheduler's standby is warm (it follows the log); the queue's replicas split
the jobs by submission, the resource pool's the nodes and the fault manager's the jobs by their shard events; both
monitors serve the status API. ``up --replicas 1`` gives up that failover for a lighter cluster."""
DEFAULT_NODES = ("A100:1", "A100:1", "V100:2")
"""The nodes ``up`` starts an agent for unless told (``--node``)."""

AGENT_PRINCIPAL = "node-agent"
"""Every agent's principal at a secured broker (``shardyard.broker.access``)."""
ADMIN_PRINCIPAL = "admin"


@dataclass
class ClusterInfo:
    run_dir: str
    bootstrap: str
    monitor_url: str
    data_root: str
    broker: str
    """Which broker it runs on: ``kafka`` (the local Apache Kafka), ``embedded`` or ``external``."""
    started_at: float
    run_id: str = field(default_factory=new_run_id)  # this cluster run's: its agents' logs are SHARD_LOGS/RUN_ID
    pids: dict[str, int] = field(default_factory=dict)
    monitor_urls: list[str] = field(default_factory=list)
    """Every monitor replica's address; ``monitor_url`` is the first. ``live()`` picks one that answers."""
    accounting_url: str = ""
    """The job accounting database the cluster writes (``shardyard history`` reads it; see ``shardyard.jobdb``)."""
    metrics_ports: dict[str, int] = field(default_factory=dict)
    """Each process's own Prometheus metrics port on 127.0.0.1 (``--metrics-port``), by process name."""
    broker_ports: dict[str, int] = field(default_factory=dict)
    """The local broker's ports (``client``; the local Kafka's ``controller`` too); empty: an outside one."""
    started: dict[str, float] = field(default_factory=dict)
    """When each process was (last) started, seconds since the epoch."""
    restarts: dict[str, int] = field(default_factory=dict)
    """How often the supervisor started each process again after it died."""
    supervisor_pid: int | None = None
    """The process that restarts the others (``shardyard.cli.supervisor``); None until ``up`` is ready."""
    secret_file: str = ""
    """The cluster secret every process seals its events with (``shardyard.bus.seal``); empty: none."""
    access_dir: str = ""
    """The secured local Kafka's CA and principals' passwords (``shardyard.broker.secure``); empty: a plain broker."""
    starter_pid: int | None = None
    """The ``up`` that started the cluster: while it starts, the cluster runs for ``claims.running``."""
    rendezvous_base: int = 0
    rendezvous_ports: int = 0
    """The rendezvous ports its agents give gangs, [base, base + ports), claimed on this host (``claims``)."""
    credentials_file: str = ""
    """The teams' keys the queue checks submissions with (``shardyard.signing``); empty: none. ``submit`` and
    ``cancel`` sign with it unless told another file."""

    def live(self) -> "ClusterInfo":
        """This cluster, its ``monitor_url`` the first monitor replica that is listening (another may have died). A
        connection is all it asks: the kernel accepts one for a process that is alive however busy it is, and refuses
        it at once for one that died; an HTTP round trip to a monitor starved of CPU cost a whole timeout per replica
        on a loaded host."""
        for url in self.monitor_urls:
            host, _, port = url.removeprefix("http://").rpartition(":")
            try:
                socket.create_connection((host, int(port)), timeout=0.5).close()
            except (OSError, ValueError):
                continue
            return replace(self, monitor_url=url)
        return self

    def save(self) -> None:
        save_json(Path(self.run_dir) / CLUSTER_FILE, asdict(self))

    @classmethod
    def new(
        cls, run_dir: Path, choice: "Choice", data_root: Path, accounting_url: str | None, secret_file: str
    ) -> "ClusterInfo":
        return cls(
            run_dir=str(run_dir.resolve()),
            bootstrap=choice.bootstrap or "",
            monitor_url="",
            data_root=str(data_root.resolve()),
            broker=choice.kind,
            started_at=time.time(),
            accounting_url=accounting_url or default_url(run_dir),
            secret_file=secret_file,
            starter_pid=os.getpid(),
        )

    def transport(self, principal: str) -> dict[str, str]:
        """The environment that makes a process speak to this cluster's broker as ``principal`` (empty: a plain
        broker, nothing to say)."""
        if not self.access_dir:
            return {}
        from shardyard.broker.secure import Access, client_env

        return client_env(Access(Path(self.access_dir)), principal)

    def submitter(self, queue: str) -> str:
        """Who submits a job of ``queue`` to a secured broker: its team's principal where the cluster has one, else
        the admin (a queue of no team: the queue refuses the job, as it would anyone's)."""
        principal = f"team.{queue}"
        return principal if self.access_dir and (Path(self.access_dir) / principal).is_file() else ADMIN_PRINCIPAL

    def record_broker(self, broker: "BrokerProcess | None") -> None:
        """The broker ``up`` started (None: an outside one, already named), saved."""
        if broker is not None:
            self.bootstrap, self.pids["broker"], self.started["broker"] = broker.bootstrap, broker.pid or 0, time.time()
            self.broker_ports = {"client": broker.port}
            if controller := getattr(broker, "controller_port", 0):
                self.broker_ports["controller"] = controller
        self.save()

    @classmethod
    def load(cls, run_dir: Path) -> "ClusterInfo":
        path = run_dir / CLUSTER_FILE
        try:
            saved = json.loads(path.read_text())
            if "embedded_broker" in saved:  # written before the local Kafka: embedded unless outside
                saved["broker"] = "embedded" if saved.pop("embedded_broker") else "external"
            return cls(**{"run_id": "", **saved})  # written before run ids: none
        except FileNotFoundError as exc:
            raise ClusterError(f"no cluster is running from {run_dir} (start one with `shardyard up`)") from exc


MONITOR_TOKEN_ENV = "SHARDYARD_MONITOR_TOKEN"
"""The read token of a monitor that listens beyond this host (``monitor/access.py``), sent with every request."""


def get_json(url: str, timeout_s: float = 2.0) -> Any:
    """The monitor's answer at ``url``, every string in it made inert for a terminal (``cli.inert``). A non-200 answer
    raises ``urllib.error.HTTPError``; one that cannot be had, ``OSError`` (``URLError`` included)."""
    token = os.environ.get(MONITOR_TOKEN_ENV)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if not url.startswith("http://"):  # https (a monitor behind a proxy): the standard client
        import urllib.request

        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as response:
            return inert_json(json.loads(response.read()))
    return inert_json(json.loads(_http_get(url, headers, timeout_s)))


def _http_get(url: str, headers: dict[str, str], timeout_s: float) -> bytes:
    """``GET url`` over plain HTTP/1.0, its body when the status is 200. Every CLI read is one such request to a
    monitor on this host: written out here, it spares each command the import of ``urllib.request`` (with
    ``http.client``, ``email`` and ``ssl``), a quarter of its start-up CPU, which a loaded host multiplies."""
    rest = url.removeprefix("http://")
    where, _, path = rest.partition("/")
    host, _, port = where.rpartition(":")
    lines = [f"GET /{path} HTTP/1.0", f"Host: {where}", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    chunks = []
    with socket.create_connection((host or where, int(port or 80)), timeout=timeout_s) as connection:
        connection.sendall("\r\n".join(lines).encode())
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    code = int(status[1]) if len(status) >= 2 and status[1].isdigit() else 0
    if code != 200:
        import urllib.error

        reason = b" ".join(status[2:]).decode(errors="replace")
        raise urllib.error.HTTPError(url, code, reason or "no HTTP status", None, None)  # type: ignore[arg-type]
    return body
