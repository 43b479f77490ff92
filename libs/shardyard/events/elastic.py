"""Elasticity signals for an autoscaler (S18): capacity the backlog needs, and nodes idle enough to reclaim."""

from typing import Annotated, Literal

from pydantic import Field

from shardyard.events.base import Event


class CapacityRequested(Event):
    """Pending jobs need GPUs the cluster does not have free: "3 x A100 needed, waiting for 40 s"."""

    type: Literal["capacity.requested"] = "capacity.requested"
    gpu_model: str = Field(description="the GPU model the jobs ask for, or ANY")
    min_tflops: float
    gpus: int = Field(ge=1, description="GPUs that would let every waiting job of this kind start")
    jobs: tuple[str, ...]
    waiting_s: float = Field(ge=0, description="how long the oldest of these jobs has waited")


class ReclaimCandidate(Event):
    """A node with no shards for ``idle_s`` that no pending job can use: an autoscaler may remove it."""

    type: Literal["capacity.reclaim_candidate"] = "capacity.reclaim_candidate"
    node_id: str
    gpu_model: str
    gpus: int
    idle_s: float


class RedundancyChanged(Event):
    """The spare ratio the fault manager sets from the recent shard failure rate (S11); the scheduler places
    ``ceil(shards x ratio)`` spares with each new gang."""

    type: Literal["redundancy.changed"] = "redundancy.changed"
    ratio: float = Field(ge=0, le=1)
    previous_ratio: float = Field(ge=0, le=1)
    failure_rate: float = Field(ge=0, le=1, description="failed shard attempts / shard attempts in the window")
    window_s: float = Field(gt=0)
    shard_attempts: int = Field(ge=0)
    shard_failures: int = Field(ge=0)


ElasticityEvent = Annotated[CapacityRequested | ReclaimCandidate, Field(discriminator="type")]
