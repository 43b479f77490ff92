"""Who this node is and how it runs its shards: the settings every part of the agent reads, fixed at start-up."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shardyard.node_agent.beats import DEFAULT_REFRESH_S
from shardyard.node_agent.disk import DEFAULT_OUTPUT_PATH
from shardyard.node_agent.environment import RunnerOptions
from shardyard.node_agent.load import LoadSource
from shardyard.node_agent.shard_users import ShardUsers
from shardyard.node_agent.warm import DEFAULT_GANG_AFTER_S, DEFAULT_TTL_S, Mode


@dataclass(frozen=True)
class NodeIdentity:
    node_id: str
    instance: str
    address: str
    rendezvous_ports: tuple[int, int]
    """The range shards rendezvous on (first port, count): the configured one, less the probe port if any."""
    cpu_cores: float
    memory_bytes: int
    mounts: Mapping[str, str]
    log_dir: Path
    python: str
    base_env: Mapping[str, str]
    load_source: LoadSource = "host"
    topology: Mapping[str, str] = field(default_factory=dict)
    runner: RunnerOptions = field(default_factory=RunnerOptions)
    standbys: Mode = "gang"
    """Which warm standbys to keep for the jobs whose shards are likely to start here soon."""
    standby_ttl_s: float = DEFAULT_TTL_S
    standby_after_s: float = DEFAULT_GANG_AFTER_S
    """``gang`` mode: how long a shard trains before its standby is started (short runs never pay for one)."""
    status_refresh_s: float = DEFAULT_REFRESH_S
    """A full heartbeat at least this often; leases between (:mod:`shardyard.node_agent.beats`)."""
    shard_users: ShardUsers = field(default_factory=ShardUsers)
    """Who each job's shards run as (by default the agent's own user)."""
    scratch_dir: Path | None = None
    probe_port: int | None = None
    """Where peers probe this node's links: the last port of the configured rendezvous range (None: no probing)."""
    env_key: bytes | None = field(default=None, repr=False)
    """The agents' key to the jobs' environment values (``shardyard.secret_env``; None: the cluster has no secret)."""
    output_path: str = DEFAULT_OUTPUT_PATH
    """The job path job outputs and checkpoints go under: the heartbeat reports the free space of its disk here."""
    """Where a shard under a user of its own gets its private HOME and TMPDIR, one directory per job."""
