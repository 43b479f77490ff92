"""The ``local`` provider: node-agent processes with declared (simulated) GPUs on this host, for the local cluster
of ``shardyard up --autoscale``.

Each node is an agent started as ``up`` starts its own (``cli.cluster._agent_argv``): the cluster's broker, seal and
agent principal, ``/data`` mounted from its data root, its shard logs under this run's folder, and a rendezvous
block of its own. ``up`` claims ``max_nodes`` blocks more than its nodes need (``claims``), after theirs: node slot
``k`` takes ports ``[base + k * RENDEZVOUS_PER_NODE, ...)``, so an added node's gangs never meet another node's
ports. Node ids are ``auto-MODEL-SLOT`` (``auto-v100-0``): never an ``up`` node's ``node-N``.

What it started is recorded twice: in ``RUN_DIR/autoscale.json`` (a restarted autoscaler takes its nodes back from
it) and in the cluster file's ``pids`` as ``node-auto-...``, where ``shardyard down`` stops them with the other
agents and ``shardyard ps`` lists them. ``remove`` stops one: SIGTERM (the agent stops its shards and leaves the
bus), then SIGKILL after ``stop_timeout_s``. ``close`` (the autoscaler stops) stops them all.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardyard.autoscale.provider import ProvidedNode, ProviderError
from shardyard.broker.ports import free_port
from shardyard.cli import claims
from shardyard.cli.children import CLUSTER_FILE, save_json
from shardyard.cli.cluster_info import AGENT_PRINCIPAL, ClusterInfo
from shardyard.cli.rundir import SHARD_LOGS
from shardyard.cli.shard_user import shard_user_fallback
from shardyard.errors import ClusterError

STATE_FILE = "autoscale.json"
PROCESS_PREFIX = "node-"
"""Its agents' names in the cluster file: ``down`` stops the ``node-`` processes first, as agents."""


def node_id_of(gpu_model: str, slot: int) -> str:
    return f"auto-{gpu_model.lower()}-{slot}"


@dataclass
class LocalProvider:
    run_dir: Path
    rendezvous_base: int
    """The first port of the autoscaler's rendezvous blocks (``up --autoscale`` passes it)."""
    slots: int
    """How many blocks it has: at most this many nodes at once."""
    stop_timeout_s: float = 15.0
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    name: str = "local"
    _children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def add(self, gpu_model: str, gpus_per_node: int, count: int) -> list[str]:
        try:
            info = ClusterInfo.load(self.run_dir)
        except ClusterError as exc:
            raise ProviderError(f"no cluster to add nodes to: {exc}") from exc
        state = self._state()
        added: list[str] = []
        for _ in range(count):
            used = {entry["slot"] for entry in state.values()}
            slot = next((k for k in range(self.slots) if k not in used), None)
            if slot is None:
                raise ProviderError(f"all {self.slots} rendezvous blocks of the autoscaler are taken")
            node_id = node_id_of(gpu_model, slot)
            port = free_port()
            try:
                process = self._start(info, node_id, slot, f"{gpu_model}:{gpus_per_node}", port)
            except OSError as exc:
                raise ProviderError(f"the agent of {node_id} could not start: {exc}") from exc
            self._children[node_id] = process
            now = time.time()
            state[node_id] = {
                "pid": process.pid,
                "started": now,
                "slot": slot,
                "gpu_model": gpu_model,
                "gpus": gpus_per_node,
                "metrics_port": port,
            }
            self._save(state)
            added.append(node_id)
        return added

    def remove(self, node_id: str) -> None:
        state = self._state()
        entry = state.pop(node_id, None)
        if entry is not None:
            self._stop({node_id: entry})
        self._save(state)

    def nodes(self) -> list[ProvidedNode]:
        state = self._state()
        running = {n: e for n, e in state.items() if self._runs(n, e)}
        if len(running) != len(state) or not self._recorded(running):
            self._save(running)  # an agent that died is no longer managed; one the cluster file lost is put back
        return [ProvidedNode(n, e["gpu_model"], e["gpus"], e["started"]) for n, e in sorted(running.items())]

    def close(self) -> None:
        self._stop(self._state())
        self._save({})

    def _start(self, info: ClusterInfo, node_id: str, slot: int, gpus: str, port: int) -> subprocess.Popen[bytes]:
        argv = [
            sys.executable,
            "-m",
            "shardyard.node_agent",
            "--node-id",
            node_id,
            "--instance",
            f"{node_id}-{int(time.time() * 1000)}",
            "--mounts",
            f"/data={info.data_root}",
            "--shared-mounts",
            "/data",
            "--cpu-cores",
            "16",
            "--memory-gib",
            "128",
            "--rendezvous-port-base",
            str(self.rendezvous_base + slot * claims.RENDEZVOUS_PER_NODE),
            "--rendezvous-port-count",
            str(claims.RENDEZVOUS_PER_NODE),
            "--log-dir",
            str(Path(info.run_dir) / SHARD_LOGS / info.run_id),
            "--gpus",
            gpus,
            "--metrics-port",
            str(port),
        ]
        env = {**self.environ, **info.transport(AGENT_PRINCIPAL), "PYTHONUNBUFFERED": "1"}
        argv += shard_user_fallback(env, lambda _said: None)  # as ``up``'s agents (``up`` said why already)
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / f"{node_id}.log").open("ab") as out:
            return subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )

    def _runs(self, node_id: str, entry: Mapping[str, Any]) -> bool:
        child = self._children.get(node_id)
        if child is not None:
            return child.poll() is None
        return claims.still_runs(entry["pid"], entry["started"])

    def _stop(self, entries: Mapping[str, Mapping[str, Any]]) -> None:
        """SIGTERM each, wait ``stop_timeout_s`` for all, SIGKILL what is left."""
        running = {n: e for n, e in entries.items() if self._runs(n, e)}
        for entry in running.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(entry["pid"], signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        while time.monotonic() < deadline and any(self._runs(n, e) for n, e in running.items()):
            time.sleep(0.1)
        for node_id, entry in running.items():
            if self._runs(node_id, entry):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(entry["pid"], signal.SIGKILL)
            child = self._children.pop(node_id, None)
            if child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=5.0)

    def _state(self) -> dict[str, dict[str, Any]]:
        try:
            found = json.loads((self.run_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def _recorded(self, state: Mapping[str, Mapping[str, Any]]) -> bool:
        """Whether the cluster file names each of its agents (``up``, still starting, rewrites it whole)."""
        try:
            pids = json.loads((self.run_dir / CLUSTER_FILE).read_text()).get("pids", {})
        except (OSError, ValueError, AttributeError):
            return True  # no cluster file (``down``): nothing to put right
        return all(pids.get(PROCESS_PREFIX + n) == e["pid"] for n, e in state.items())

    def _save(self, state: Mapping[str, Mapping[str, Any]]) -> None:
        """Its own record, and its agents in the cluster file (where ``down`` finds them): a read-modify-write of the
        processes named ``node-auto-...`` only."""
        save_json(self.run_dir / STATE_FILE, dict(state))
        path = self.run_dir / CLUSTER_FILE
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return  # ``down`` removed it: nothing to keep true any more
        for key in ("pids", "started", "metrics_ports"):
            table = record.setdefault(key, {})
            for name in [n for n in table if n.startswith(PROCESS_PREFIX + "auto-")]:
                del table[name]
        for node_id, entry in state.items():
            name = PROCESS_PREFIX + node_id
            record["pids"][name], record["started"][name] = entry["pid"], entry["started"]
            record["metrics_ports"][name] = entry["metrics_port"]
        save_json(path, record)
