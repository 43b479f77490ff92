"""The simulated cluster, declared as ``MODEL:GPUSxNODES`` groups: ``A100:8x4,V100:8x8`` is 4 nodes of 8 A100 and
8 nodes of 8 V100. Node ids are ``<model>-<n>`` (``a100-000``), numbered per model in declaration order."""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shardyard.errors import ConfigError
from shardyard.gpus import DEFAULT_TFLOPS, canonical_model

DEFAULT_CLUSTER = "A100:8x8,V100:8x8,H100:8x4"
MAX_GPUS_PER_NODE = 64
MAX_NODES = 10_000

_GROUP = re.compile(r"(?P<model>[^:\s]+)\s*:\s*(?P<gpus>\d+)\s*[xX]\s*(?P<nodes>\d+)")


@dataclass(frozen=True)
class NodeSpec:
    node_id: str
    gpu_model: str
    tflops: float
    gpus: int


def parse_cluster(text: str, catalogue: Mapping[str, float] = DEFAULT_TFLOPS) -> tuple[NodeSpec, ...]:
    """The nodes of a cluster declaration. Raises ConfigError naming the bad group."""
    groups = [part.strip() for part in text.split(",")]
    if not text.strip():
        raise ConfigError(f"empty cluster declaration; write MODEL:GPUSxNODES groups, e.g. {DEFAULT_CLUSTER}")
    nodes: list[NodeSpec] = []
    numbered: dict[str, int] = {}
    for position, group in enumerate(groups, start=1):
        match = _GROUP.fullmatch(group)
        if match is None:
            raise ConfigError(
                f"cluster group {position} {group!r} is not MODEL:GPUSxNODES (e.g. A100:8x4 = 4 nodes of 8 A100)"
            )
        model = canonical_model(match["model"])
        if model not in catalogue:
            known = ", ".join(sorted(catalogue))
            raise ConfigError(
                f"cluster group {position} {group!r}: unknown GPU model {match['model']!r}; use one of {known} "
                "(or add it with --gpu-tflops MODEL=TFLOPS)"
            )
        gpus, count = int(match["gpus"]), int(match["nodes"])
        if not 1 <= gpus <= MAX_GPUS_PER_NODE:
            raise ConfigError(f"cluster group {position} {group!r}: GPUs per node must be 1..{MAX_GPUS_PER_NODE}")
        if count < 1:
            raise ConfigError(f"cluster group {position} {group!r}: the node count must be at least 1")
        first = numbered.get(model, 0)
        numbered[model] = first + count
        nodes.extend(NodeSpec(f"{model.lower()}-{first + i:03d}", model, catalogue[model], gpus) for i in range(count))
        if len(nodes) > MAX_NODES:
            raise ConfigError(f"the cluster declares more than {MAX_NODES} nodes")
    return tuple(nodes)


def describe(nodes: Sequence[NodeSpec]) -> str:
    """``12 nodes, 96 GPUs (A100 32, V100 64)``."""
    per_model: dict[str, int] = {}
    for node in nodes:
        per_model[node.gpu_model] = per_model.get(node.gpu_model, 0) + node.gpus
    kinds = ", ".join(f"{model} {count}" for model, count in per_model.items())
    plural = "" if len(nodes) == 1 else "s"
    return f"{len(nodes)} node{plural}, {sum(per_model.values())} GPUs ({kinds})"
