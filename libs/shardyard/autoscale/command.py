"""The ``command`` provider: an operator's scripts add and remove nodes (a cloud group, a Kubernetes pool, Slurm).

- **add**: ``ADD_COMMAND MODEL GPUS_PER_NODE COUNT``, with ``SHARDYARD_GPU_MODEL``, ``SHARDYARD_GPUS_PER_NODE`` and
  ``SHARDYARD_NODE_COUNT`` in its environment. It prints the ids of the nodes it is adding, one a line (each the
  ``--node-id`` its node agent will report); a script that prints none gets ``cmd-MODEL-N`` ids, for which the
  agents must then be started with those ids.
- **remove**: ``REMOVE_COMMAND NODE_ID``, with ``SHARDYARD_NODE_ID`` (and the node's model and GPUs) in its
  environment.

Each runs with a timeout; one that exits non-zero, cannot start or runs past it raises ``ProviderError`` (the
script is killed), which the autoscaler logs and counts (``shardyard_autoscaler_actions_total{outcome="failed"}``).
What it manages is what it added and has not removed in this process's life (``nodes``).
"""

import os
import shlex
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from shardyard.autoscale.provider import ProvidedNode, ProviderError

OUTPUT_KEPT = 2000
"""How much of a failing script's output its error quotes."""


@dataclass
class CommandProvider:
    add_command: str
    remove_command: str
    timeout_s: float = 300.0
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    name: str = "command"
    managed: dict[str, ProvidedNode] = field(default_factory=dict)
    _counter: int = 0

    def add(self, gpu_model: str, gpus_per_node: int, count: int) -> list[str]:
        env = {
            "SHARDYARD_GPU_MODEL": gpu_model,
            "SHARDYARD_GPUS_PER_NODE": str(gpus_per_node),
            "SHARDYARD_NODE_COUNT": str(count),
        }
        output = self._run(self.add_command, [gpu_model, str(gpus_per_node), str(count)], env)
        ids = [line.strip() for line in output.splitlines() if line.strip()][:count]
        while len(ids) < count:
            self._counter += 1
            ids.append(f"cmd-{gpu_model.lower()}-{self._counter}")
        now = time.time()
        for node_id in ids:
            self.managed[node_id] = ProvidedNode(node_id, gpu_model, gpus_per_node, now)
        return ids

    def remove(self, node_id: str) -> None:
        node = self.managed.get(node_id)
        env = {"SHARDYARD_NODE_ID": node_id}
        if node is not None:
            env |= {"SHARDYARD_GPU_MODEL": node.gpu_model, "SHARDYARD_GPUS_PER_NODE": str(node.gpus)}
        self._run(self.remove_command, [node_id], env)
        self.managed.pop(node_id, None)

    def nodes(self) -> list[ProvidedNode]:
        return list(self.managed.values())

    def close(self) -> None:
        """The nodes outlive the autoscaler: they are the operator's."""

    def _run(self, command: str, args: list[str], env: Mapping[str, str]) -> str:
        argv = [*shlex.split(command), *args]
        try:
            done = subprocess.run(
                argv,
                env={**self.environ, **env},
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ProviderError(f"{argv[0]} ran past its timeout of {self.timeout_s:.0f}s and was killed") from exc
        except OSError as exc:
            raise ProviderError(f"{argv[0]} could not start: {exc}") from exc
        out = done.stdout.decode(errors="replace")
        if done.returncode != 0:
            said = (done.stderr.decode(errors="replace") or out).strip()[-OUTPUT_KEPT:]
            raise ProviderError(f"{shlex.join(argv)} exited {done.returncode}: {said or '(no output)'}")
        return out
