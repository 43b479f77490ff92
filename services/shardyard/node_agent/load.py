"""What ``cpu_load`` a heartbeat reports: the host's load, or the CPU its own shards use. Pure.

Several simulated nodes may share one host, so the host's load average says nothing about any one of them: a node
with simulated GPUs reports the CPU its running shards use (their progress reports' ``cpu_percent``) as a fraction
of its declared cores. A node with real GPUs owns its host and reports the 1-minute load average per CPU.
"""

from collections.abc import Iterable
from typing import Literal

LoadSetting = Literal["auto", "host", "shards"]
LoadSource = Literal["host", "shards"]


def load_source(setting: LoadSetting, *, simulated: bool) -> LoadSource:
    """``auto``: ``shards`` for simulated GPUs, ``host`` for real ones."""
    if setting == "auto":
        return "shards" if simulated else "host"
    return setting


def host_load(load_1m: float, cpus: int) -> float:
    """The 1-minute load average per CPU."""
    return max(0.0, load_1m) / max(1, cpus)


def shards_load(shard_cores: Iterable[float], node_cores: float) -> float:
    """The cores the node's shards use (1.0 = one core busy), as a fraction of the node's declared cores."""
    if node_cores <= 0:
        raise ValueError(f"node_cores must be > 0, got {node_cores}")
    return sum(max(0.0, cores) for cores in shard_cores) / node_cores
