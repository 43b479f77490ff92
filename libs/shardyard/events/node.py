"""Node events: agent heartbeats, the resource pool's node state (compacted, keyed by node) and node loss."""

import math
from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import Field, model_validator

from shardyard.events.base import AwareDatetime, Event, Model


class GpuStatus(Model):
    index: int = Field(ge=0)
    model: str
    tflops: float = Field(gt=0)
    memory_bytes: int = Field(ge=0)
    memory_used_bytes: int = Field(default=0, ge=0)
    utilization: float = Field(default=0.0, ge=0, le=1)
    temperature_c: float | None = None
    simulated: bool = False
    tflops_source: Literal["catalogue", "measured"] = Field(
        default="catalogue", description="where the TFLOPS figure comes from: the catalogue, or a start-up benchmark"
    )
    healthy: bool = Field(
        default=True, description="False once the GPU faulted (a critical Xid, an uncorrected ECC error): no new shards"
    )
    fault: str | None = Field(
        default=None, description='why the GPU is unhealthy, e.g. "Xid 79: GPU has fallen off the bus"'
    )


ArtifactPlace = Literal["local", "shared"]

MAX_ARTIFACT_ERRORS = 64
"""At most this many artifact errors ride on one heartbeat (the first paths in sorted order): a node watching many
unservable paths must not grow its heartbeat without bound."""
MAX_ARTIFACT_ERROR_CHARS = 200
MAX_ARTIFACTS_ABSENT = 64
"""At most this many watched paths found absent ride on one heartbeat (the first in sorted order)."""


class ArtifactErrorReason(StrEnum):
    NOT_SERVED = "NOT_SERVED"
    """Not absolute, not normalised, or not under a mount this node serves: never looked at here."""
    UNREADABLE = "UNREADABLE"
    """Looking at it failed: name too long, permission denied, a symbolic link loop."""


class ArtifactError(Model):
    """Why a watched path counts as not present on a node, though it may be there."""

    reason: ArtifactErrorReason
    message: str = Field(max_length=MAX_ARTIFACT_ERROR_CHARS, description="e.g. 'ENAMETOOLONG: File name too long'")


MAX_NAMED_NODES: Final = 5
"""Nodes a :class:`MissingArtifact` names at most (its counts say how many there are)."""


class MissingArtifact(Model):
    """A job path (its pretrained model or dataset) that nodes the job could use lack: what a job waiting
    ``WAITING_FOR_ARTIFACT`` waits for. Those nodes are the ones up, not draining and of the GPU kind it asks for."""

    path: str = Field(description="the job path, as the job names it")
    nodes: tuple[str, ...] = Field(max_length=MAX_NAMED_NODES, description="the first nodes lacking it, by id")
    lacking: int = Field(ge=0, description="the nodes whose agents looked for it and did not find it, named or not")
    unchecked: int = Field(
        default=0, ge=0, description="nodes lacking it whose agents have not looked for it yet (not named)"
    )
    of_nodes: int = Field(ge=0, description="the nodes the job could use, lacking it or not")
    host_paths: dict[str, str] = Field(
        default_factory=dict,
        description="named node -> where the path lies on its disk through its mounts; a node that does not mount "
        "the path is left out (its agent never looks for it)",
    )


class DiskSpace(Model):
    """The filesystem behind a node's output path (where job outputs and checkpoints go): its free and total bytes,
    as ``statvfs`` gives them to an unprivileged writer (``f_bavail``)."""

    path: str = Field(description="the job path measured (the node's output path, e.g. /data/checkpoints)")
    free_bytes: int = Field(ge=0)
    total_bytes: int = Field(ge=0)


DISK_STEP: Final = 1.1
"""Free space moves the inventory (and sends a full heartbeat) when it crosses a step of this ratio: 10 %."""
DISK_STEP_MIN_BYTES: Final = 1 << 20
"""Below this much free space, one step: a full disk's last bytes do not send a heartbeat each."""


def disk_step(disk: DiskSpace | None) -> int | None:
    """Which step of free space ``disk`` is in: 0 under 1 MiB, then one more per 10 % more. What the inventory holds
    of it, so that a disk filling or emptying sends a full heartbeat (and a new node state) per 10 %, not per beat,
    and a drop to a floor is seen within a step of it."""
    if disk is None:
        return None
    if disk.free_bytes < DISK_STEP_MIN_BYTES:
        return 0
    return 1 + int(math.log(disk.free_bytes / DISK_STEP_MIN_BYTES, DISK_STEP))


class RunningShard(Model):
    job_id: str
    shard_index: int
    attempt: int
    pid: int | None = None


class Heartbeat(Event):
    type: Literal["node.heartbeat"] = "node.heartbeat"
    node_id: str
    agent_instance: str = Field(description="changes when the agent restarts")
    seq: int = Field(ge=0)
    host: str
    address: str = Field(description="address other nodes reach this one at (rendezvous)")
    rendezvous_ports: tuple[int, int] = Field(description="first port and count of this node's rendezvous range")
    probe_port: int | None = Field(
        default=None, gt=0, lt=65536, description="where peers probe this node's links (None: it is not probed)"
    )
    gpus: tuple[GpuStatus, ...]
    cpu_cores: float = Field(gt=0)
    memory_bytes: int = Field(ge=0)
    cpu_load: float = Field(ge=0, description="fraction of the node's CPU in use, 0..1 (may exceed 1 when loaded)")
    mounts: dict[str, str] = Field(default_factory=dict, description="job path prefix -> local path")
    running: tuple[RunningShard, ...] = ()
    artifacts: dict[str, ArtifactPlace] = Field(
        default_factory=dict, description="watched job paths (models, datasets) present here: local disk or shared"
    )
    topology: dict[str, str] = Field(default_factory=dict, description="placement labels: zone, rack")
    artifact_errors: dict[str, ArtifactError] = Field(
        default_factory=dict,
        max_length=MAX_ARTIFACT_ERRORS,
        description="watched job paths this node could not look at, and why (they are not in artifacts)",
    )
    artifacts_absent: tuple[str, ...] = Field(
        default=(),
        max_length=MAX_ARTIFACTS_ABSENT,
        description="watched job paths this node looked for and did not find (with artifacts and artifact_errors: "
        "every path it has looked at; a watched path in none of the three it has not looked at yet)",
    )
    output_disk: DiskSpace | None = Field(
        default=None, description="free space of the filesystem job outputs and checkpoints map to (None: unknown)"
    )
    loop_lag_s: float = Field(
        default=0.0, ge=0, description="the worst lag of the agent's event loop since its last beat"
    )
    margin_s: float = Field(
        default=0.0, ge=0, description="how much later to suspect the node: its stalls of the last minute (liveness)"
    )


class NodeLease(Event):
    """A node's liveness renewal: what its agent sends every second between full heartbeats, which carry its
    inventory only when it changed and on a slow refresh (as a Kubernetes node lease renews liveness apart from the
    node's status). Beside who and which beat, it carries the live telemetry: CPU load and each GPU's use, in the
    order of the node's GPUs."""

    type: Literal["node.lease"] = "node.lease"
    node_id: str
    agent_instance: str = Field(description="changes when the agent restarts")
    seq: int = Field(ge=0, description="the agent's beat counter, shared with its full heartbeats")
    cpu_load: float = Field(ge=0)
    gpu_utilization: tuple[float, ...] = ()
    gpu_memory_used_bytes: tuple[int, ...] = ()
    gpu_temperature_c: tuple[float | None, ...] = ()
    loop_lag_s: float = Field(
        default=0.0, ge=0, description="the worst lag of the agent's event loop since its last beat"
    )
    margin_s: float = Field(
        default=0.0, ge=0, description="how much later to suspect the node: its stalls of the last minute (liveness)"
    )


MAX_RELAYED_LEASES: Final = 1_000
"""The most leases one relayed record carries (about 300 kB)."""


class NodeLeases(Event):
    """Leases of many nodes in one record, from a relay that publishes for them (a per-host or per-rack relay; the
    scale bench's node simulator is one): one record to write, seal, fetch and decode instead of one a node. Every
    lease in it is for a node whose heartbeats go to the record's own partition, the one ``node_id`` (the first
    lease's node) keys: the relay groups its nodes by partition, and a pool replica applies only the leases of the
    nodes it owns. A relay carries leases only: a node's full heartbeat, which introduces it, still comes on its
    own."""

    type: Literal["node.leases"] = "node.leases"
    relay: str = Field(min_length=1, max_length=256, description="who relays: the sealer's component")
    node_id: str = Field(description="the node the record is keyed by: its first lease's")
    leases: tuple[NodeLease, ...] = Field(min_length=1, max_length=MAX_RELAYED_LEASES)

    @model_validator(mode="after")
    def _keyed_by_its_first_lease(self) -> "NodeLeases":
        if self.leases[0].node_id != self.node_id:
            raise ValueError(f"node_id {self.node_id!r} is not the first lease's node {self.leases[0].node_id!r}")
        return self


def inventory_of(heartbeat: Heartbeat) -> tuple[object, ...]:
    """What a heartbeat says that is not telemetry (a lease carries the telemetry): who and where the node is, its
    GPUs and their health, cores, memory, mounts, running shards, artifacts (and artifact errors), topology and the
    10 % step of its output disk's free space (:func:`disk_step`). An agent sends a full heartbeat when this changes;
    the pool publishes the node's state when it does."""
    gpus = tuple(
        (g.index, g.model, g.tflops, g.memory_bytes, g.simulated, g.tflops_source, g.healthy, g.fault)
        for g in heartbeat.gpus
    )
    return (
        heartbeat.agent_instance,
        heartbeat.host,
        heartbeat.address,
        heartbeat.rendezvous_ports,
        heartbeat.probe_port,
        gpus,
        heartbeat.cpu_cores,
        heartbeat.memory_bytes,
        heartbeat.mounts,
        heartbeat.running,
        heartbeat.artifacts,
        heartbeat.topology,
        heartbeat.artifact_errors,
        heartbeat.artifacts_absent,
        disk_step(heartbeat.output_disk),
    )


def lease_of(heartbeat: Heartbeat) -> NodeLease:
    """The lease that says what ``heartbeat`` says of liveness and telemetry."""
    return NodeLease(
        occurred_at=heartbeat.occurred_at,
        node_id=heartbeat.node_id,
        agent_instance=heartbeat.agent_instance,
        seq=heartbeat.seq,
        cpu_load=heartbeat.cpu_load,
        gpu_utilization=tuple(g.utilization for g in heartbeat.gpus),
        gpu_memory_used_bytes=tuple(g.memory_used_bytes for g in heartbeat.gpus),
        gpu_temperature_c=tuple(g.temperature_c for g in heartbeat.gpus),
        loop_lag_s=heartbeat.loop_lag_s,
        margin_s=heartbeat.margin_s,
    )


class NodeDrain(Event):
    """An operator drains a node (no new shards; running ones finish) or undrains it (``shardyard drain``)."""

    type: Literal["node.drain"] = "node.drain"
    node_id: str
    draining: bool


class NodeStatus(StrEnum):
    ALIVE = "ALIVE"
    SUSPECT = "SUSPECT"
    LOST = "LOST"


class NodeState(Event):
    type: Literal["node.state"] = "node.state"
    node_id: str
    status: NodeStatus
    agent_instance: str
    host: str
    address: str
    rendezvous_ports: tuple[int, int]
    probe_port: int | None = None
    last_heartbeat_at: AwareDatetime
    last_beat_seq: int = Field(
        default=0, ge=0, description="the newest beat of agent_instance read when this was published: older ones replay"
    )
    gpus: tuple[GpuStatus, ...]
    allocated_gpus: tuple[int, ...] = Field(default=(), description="GPU indices reserved by assignments")
    cpu_cores: float
    memory_bytes: int
    cpu_load: float
    running: tuple[RunningShard, ...] = ()
    artifacts: dict[str, ArtifactPlace] = Field(default_factory=dict)
    artifacts_absent: tuple[str, ...] = Field(
        default=(),
        description="watched job paths its agent looked for and did not find, or could not look at (a path in "
        "neither this nor artifacts: not looked at yet)",
    )
    mounts: dict[str, str] = Field(
        default_factory=dict, description="job path prefix -> local path, as its last full heartbeat said"
    )
    topology: dict[str, str] = Field(default_factory=dict)
    draining: bool = False
    output_disk: DiskSpace | None = Field(default=None, description="as its last full heartbeat said (None: unknown)")


class NodeLost(Event):
    type: Literal["node.lost"] = "node.lost"
    node_id: str
    last_heartbeat_at: AwareDatetime
    silent_for_s: float


NodeEvent = Annotated[
    Heartbeat | NodeLease | NodeLeases | NodeDrain | NodeState | NodeLost, Field(discriminator="type")
]
HeartbeatEvent = Annotated[Heartbeat | NodeLease | NodeLeases | NodeDrain, Field(discriminator="type")]
"""What the heartbeats topic carries: agents' full heartbeats and leases, relays' batches of leases, and operators'
drain requests, all keyed by node."""
