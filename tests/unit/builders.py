"""Small factories for the events and values unit tests feed the pure cores; keyword overrides change one field."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from shardyard.events import (
    GpuStatus,
    Heartbeat,
    JobScheduled,
    JobSpec,
    NodeLeases,
    NodeState,
    NodeStatus,
    RedundancyChanged,
    ShardAssignment,
    ShardCompleted,
    ShardFailed,
    ShardPlacement,
    ShardProgress,
    ShardStarted,
    Workload,
)
from shardyard.events.job import FailureCause
from shardyard.events.node import lease_of

GIB = 1024**3
T0 = datetime(2026, 1, 1, tzinfo=UTC)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fine_tune_gpt2.json"


def at(seconds: float = 0.0) -> datetime:
    """A fixed instant ``seconds`` after T0."""
    return T0 + timedelta(seconds=seconds)


def submission(**overrides: Any) -> dict[str, Any]:
    """The S15 example document; ``overrides`` replace top-level fields."""
    document = json.loads(EXAMPLE.read_text())
    return copy.deepcopy({**document, **overrides})


def raw(document: object) -> bytes:
    return json.dumps(document).encode()


def job_spec(**overrides: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "job_id": "job-1",
        "task_type": "micro_train",
        "priority": 0,
        "gpu_count": 2,
        "gpu_model": "A100",
        "min_tflops": 35.0,
        "memory_bytes": 64 * GIB,
        "cpu_cores": 8.0,
        "model_path": "/data/models/gpt2",
        "dataset_path": "/data/datasets/wikitext",
        "shard_count": 2,
        "sync_interval": 100,
        "max_steps": 300,
        "batch_size": 8,
        "seq_len": 64,
        "lr": 3e-3,
        "seed": 0,
        "submitted_at": T0,
    }
    if "gpu_count" in overrides and "shard_count" not in overrides:
        overrides["shard_count"] = overrides["gpu_count"]
    return JobSpec(**{**fields, **overrides})


def gpus(model: str = "A100", count: int = 2, tflops: float = 35.0, memory_gib: int = 80) -> tuple[GpuStatus, ...]:
    return tuple(
        GpuStatus(index=i, model=model, tflops=tflops, memory_bytes=memory_gib * GIB, simulated=True)
        for i in range(count)
    )


ARTIFACTS = {"/data/models/gpt2": "shared", "/data/datasets/wikitext": "shared"}
"""The default job's model and dataset, as a node reports them when they sit on a shared path."""


def heartbeat(node_id: str = "node-a", **overrides: Any) -> Heartbeat:
    fields: dict[str, Any] = {
        "occurred_at": T0,
        "node_id": node_id,
        "agent_instance": f"{node_id}-agent-1",
        "seq": 0,
        "host": node_id,
        "address": f"{node_id}.cluster",
        "rendezvous_ports": (29500, 16),
        "gpus": gpus(),
        "cpu_cores": 32.0,
        "memory_bytes": 256 * GIB,
        "cpu_load": 0.1,
        "artifacts": ARTIFACTS,
    }
    return Heartbeat(**{**fields, **overrides})


def relayed(relay: str, *beats: Heartbeat, occurred_at: datetime = T0) -> NodeLeases:
    """A relay's record of the leases that say what ``beats`` say of liveness and telemetry."""
    leases = tuple(lease_of(beat) for beat in beats)
    return NodeLeases(occurred_at=occurred_at, relay=relay, node_id=leases[0].node_id, leases=leases)


def node_state(node_id: str = "node-a", **overrides: Any) -> NodeState:
    fields: dict[str, Any] = {
        "occurred_at": T0,
        "node_id": node_id,
        "status": NodeStatus.ALIVE,
        "agent_instance": f"{node_id}-agent-1",
        "host": node_id,
        "address": f"{node_id}.cluster",
        "rendezvous_ports": (29500, 16),
        "last_heartbeat_at": T0,
        "gpus": gpus(),
        "cpu_cores": 32.0,
        "memory_bytes": 256 * GIB,
        "cpu_load": 0.1,
        "artifacts": ARTIFACTS,
    }
    return NodeState(**{**fields, **overrides})


def workload(**overrides: Any) -> Workload:
    fields: dict[str, Any] = {
        "model_path": "/data/models/gpt2",
        "dataset_path": "/data/datasets/wikitext",
        "output_path": "/data/checkpoints/job-1",
        "sync_interval": 100,
        "max_steps": 300,
        "batch_size": 8,
        "seq_len": 64,
        "lr": 3e-3,
        "seed": 0,
    }
    return Workload(**{**fields, **overrides})


def assignment(
    job_id: str = "job-1", shard_index: int = 0, node_id: str = "node-a", **overrides: Any
) -> ShardAssignment:
    fields: dict[str, Any] = {
        "occurred_at": T0,
        "job_id": job_id,
        "shard_index": shard_index,
        "world_size": 2,
        "node_id": node_id,
        "gpu_indices": (shard_index,),
        "attempt": 1,
        "term": 1,
        "master_addr": "10.0.0.1",
        "master_port": 29500,
        "workload": workload(),
    }
    return ShardAssignment(**{**fields, **overrides})


def placement(shard_index: int, node_id: str = "node-a", gpu: int | None = None) -> ShardPlacement:
    return ShardPlacement(
        shard_index=shard_index,
        node_id=node_id,
        gpu_indices=(shard_index if gpu is None else gpu,),
        gpu_model="A100",
        match_score=1.0,
    )


def scheduled(job_id: str = "job-1", *nodes: str, **overrides: Any) -> JobScheduled:
    """A JobScheduled with one shard per entry of ``nodes`` (default: two shards on node-a)."""
    nodes = nodes or ("node-a", "node-a")
    fields: dict[str, Any] = {
        "occurred_at": T0,
        "job_id": job_id,
        "attempt": 1,
        "term": 1,
        "coordinator_node": nodes[0],
        "rendezvous_port": 29500,
        "placements": tuple(placement(i, node) for i, node in enumerate(nodes)),
    }
    return JobScheduled(**{**fields, **overrides})


def _shard_fields(job_id: str, shard_index: int, overrides: dict[str, Any]) -> dict[str, Any]:
    return {
        "occurred_at": T0,
        "job_id": job_id,
        "shard_index": shard_index,
        "attempt": 1,
        "node_id": "node-a",
        **overrides,
    }


def started(job_id: str = "job-1", shard_index: int = 0, **overrides: Any) -> ShardStarted:
    return ShardStarted(**_shard_fields(job_id, shard_index, {"pid": 1000 + shard_index, **overrides}))


def progress(job_id: str = "job-1", shard_index: int = 0, **overrides: Any) -> ShardProgress:
    defaults: dict[str, Any] = {
        "step": 1,
        "loss": 4.0,
        "samples_per_s": 100.0,
        "allreduce_ms": 0.0,
        "allreduce_bytes": 0,
        "syncs": 0,
        "cpu_percent": 50.0,
    }
    return ShardProgress(**_shard_fields(job_id, shard_index, {**defaults, **overrides}))


def completed(job_id: str = "job-1", shard_index: int = 0, **overrides: Any) -> ShardCompleted:
    defaults: dict[str, Any] = {"final_loss": 2.5, "steps": 300, "checkpoint_dir": f"/data/checkpoints/{job_id}"}
    return ShardCompleted(**_shard_fields(job_id, shard_index, {**defaults, **overrides}))


def failed(job_id: str = "job-1", shard_index: int = 0, **overrides: Any) -> ShardFailed:
    defaults: dict[str, Any] = {"cause": FailureCause.PROCESS_EXIT, "exit_code": 1, "message": "exit code 1"}
    return ShardFailed(**_shard_fields(job_id, shard_index, {**defaults, **overrides}))


def redundancy(ratio: float) -> RedundancyChanged:
    """The fault manager's spare ratio ``ratio`` (from a failure rate of half of it)."""
    return RedundancyChanged(
        occurred_at=at(0),
        ratio=ratio,
        previous_ratio=0,
        failure_rate=ratio / 2,
        window_s=600,
        shard_attempts=20,
        shard_failures=1,
    )
