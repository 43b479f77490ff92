"""A pending job as one placement decision sees it: what its filters read (``filters``), the groups it may use, and
its queue order (priority with aging). Pure."""

from datetime import datetime

from shardyard.events import PendingReason
from shardyard.gpus import match_score
from shardyard.placement.filters import group_filters
from shardyard.placement.index import ClusterIndex, norm_path
from shardyard.placement.model import (
    PendingJob,
    Policy,
)

RESERVABLE = frozenset(
    {
        PendingReason.INSUFFICIENT_GPUS,
        PendingReason.INSUFFICIENT_MEMORY,
        PendingReason.INSUFFICIENT_CPU,
        PendingReason.RESERVED_FOR_HIGHER_PRIORITY,
        PendingReason.LOAD_TOO_HIGH,
    }
)
"""Reasons that running jobs ending would cure: the job holds a reservation (wrong model, missing artifacts no)."""


def effective_priority(job: PendingJob, policy: Policy, now: datetime) -> float:
    waited_min = max(0.0, (now - job.ready_at).total_seconds()) / 60.0
    return job.spec.priority + policy.aging_per_minute * waited_min


def degraded_allowed(job: PendingJob, now: datetime) -> bool:
    spec = job.spec
    return spec.min_match is not None and (now - job.ready_at).total_seconds() >= spec.max_wait_s


class Candidate:
    """A pending job with what every step of its decision needs, computed once."""

    __slots__ = (
        "cpu_per_shard",
        "dataset_path",
        "degraded",
        "eligible",
        "excluded",
        "k",
        "memory_per_shard",
        "model_path",
        "pending",
        "spec",
    )

    def __init__(self, job: PendingJob, index: ClusterIndex, now: datetime) -> None:
        self.pending = job
        self.spec = job.spec
        self.k = job.spec.shard_count
        self.memory_per_shard = job.spec.memory_per_shard
        self.cpu_per_shard = job.spec.cpu_per_shard
        self.degraded = degraded_allowed(job, now)
        self.excluded = job.excluded_nodes
        self.model_path = norm_path(job.spec.model_path)
        self.dataset_path = norm_path(job.spec.dataset_path)
        self.eligible: dict[tuple[str, float], float] = {}
        """Group key -> match score, for the groups that pass the group filters (model and TFLOPS, or degraded)."""
        checks = group_filters(self)
        for key, group in index.groups.items():
            # ``filters.group_failing``, inline: this runs for every group in every decision.
            for f in checks:
                if not f.check(group, self):
                    break
            else:
                self.eligible[key] = round(match_score(group.tflops, self.spec.min_tflops), 2)

    def shape(self) -> tuple[object, ...]:
        spec = self.spec
        return (
            spec.gpu_model,
            spec.min_tflops,
            self.k,
            self.memory_per_shard,
            self.cpu_per_shard,
            self.model_path,
            self.dataset_path,
            spec.min_match if self.degraded else None,
            self.excluded,
            spec.priority,
        )
