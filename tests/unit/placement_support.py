"""Builders for the placement core's table tests: nodes as the policy sees them, pending and running jobs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shardyard.events import NodeStatus
from shardyard.placement.cycle import schedule
from shardyard.placement.model import (
    Decision,
    NodeView,
    PendingJob,
    Place,
    Policy,
    RunningJob,
    Snapshot,
    Unschedulable,
)
from tests.unit.builders import ARTIFACTS, GIB, T0, at, job_spec

TFLOPS = {"A100": 35.0, "V100": 15.0, "H100": 67.0}


def node(node_id: str, model: str = "A100", gpus: int = 2, **overrides: Any) -> NodeView:
    view = NodeView(
        node_id=node_id,
        status=NodeStatus.ALIVE,
        address=f"{node_id}.cluster",
        gpu_model=model,
        tflops=TFLOPS.get(model, 35.0),
        free_gpus=tuple(range(gpus)),
        free_memory_bytes=256 * GIB,
        free_cpu_cores=32.0,
        cpu_load=0.1,
        rendezvous_ports=(29500, 29501),
        total_gpus=gpus,
        artifacts=ARTIFACTS,
    )
    return replace(view, **overrides)


def pending(job_id: str = "job-1", *, ready: float = 0.0, **spec: Any) -> PendingJob:
    excluded = spec.pop("excluded_nodes", frozenset())
    return PendingJob(job_spec(job_id=job_id, **spec), at(ready), frozenset(excluded))


def running(job_id: str, *shards: tuple[str, tuple[int, ...]], priority: int = 0, **overrides: Any) -> RunningJob:
    fields: dict[str, Any] = {
        "job_id": job_id,
        "priority": priority,
        "preemptible": True,
        "started_at": T0,
        "shards": shards,
        "memory_per_shard": 32 * GIB,
        "cpu_per_shard": 4.0,
    }
    return RunningJob(**{**fields, **overrides})


def decide(
    nodes: list[NodeView],
    jobs: list[PendingJob],
    policy: Policy | None = None,
    *,
    now: float = 1.0,
    gangs: tuple[RunningJob, ...] = (),
    rtt: dict[tuple[str, str], float] | None = None,
) -> list[Decision]:
    return schedule(Snapshot(tuple(nodes), gangs, rtt or {}), jobs, policy, now=at(now))


def only(nodes: list[NodeView], job: PendingJob | None = None, **kwargs: Any) -> Decision:
    (decision,) = decide(nodes, [job or pending()], **kwargs)
    return decision


def placed_on(decision: Decision) -> list[str]:
    assert isinstance(decision, Place), decision
    return [p.node_id for p in decision.placements]


def blocked(decision: Decision) -> Unschedulable:
    assert isinstance(decision, Unschedulable), decision
    return decision
