"""A pending job as one placement decision sees it: the filters it sets (names shared with the reasons) and its
queue order (priority with aging). Pure."""

from datetime import datetime

from shardyard.events import PendingReason
from shardyard.gpus import match_score
from shardyard.placement.index import ClusterIndex, Group, norm_path
from shardyard.placement.model import (
    PendingJob,
    Policy,
)

NOT_ALIVE = "node not alive"
DRAINING = "node draining"
MODEL = "GPU model mismatch"
TFLOPS = "TFLOPS below minimum"
MATCH = "match below min_match"
NO_GPU = "no free GPU"
RESERVED = "reserved for a higher-priority job"
EXCLUDED = "excluded after a failure"
MEMORY = "insufficient memory"
CPU = "insufficient CPU"
ARTIFACT = "model or dataset absent"
TOO_FEW = "fewer free GPUs than shards"
NO_PORT = "no free rendezvous port"

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


def load_filter_name(policy: Policy) -> str:
    return f"load above {policy.load_threshold:.0%}"


def effective_priority(job: PendingJob, policy: Policy, now: datetime) -> float:
    waited_min = max(0.0, (now - job.ready_at).total_seconds()) / 60.0
    return job.spec.priority + policy.aging_per_minute * waited_min


def degraded_allowed(job: PendingJob, now: datetime) -> bool:
    spec = job.spec
    return spec.min_match is not None and (now - job.ready_at).total_seconds() >= spec.max_wait_s


class Candidate:
    """A pending job with what every step of its decision needs, computed once."""

    __slots__ = ("dataset_path", "degraded", "eligible", "excluded", "k", "model_path", "pending", "spec")

    def __init__(self, job: PendingJob, index: ClusterIndex, now: datetime) -> None:
        self.pending = job
        self.spec = job.spec
        self.k = job.spec.shard_count
        self.degraded = degraded_allowed(job, now)
        self.excluded = job.excluded_nodes
        self.model_path = norm_path(job.spec.model_path)
        self.dataset_path = norm_path(job.spec.dataset_path)
        self.eligible: dict[tuple[str, float], float] = {}
        """Group key -> match score, for the groups that pass the model/TFLOPS (or degraded) filter."""
        for key, group in index.groups.items():
            if self.why_not(group) is None:
                self.eligible[key] = round(match_score(group.tflops, self.spec.min_tflops), 2)

    def why_not(self, group: Group) -> str | None:
        spec = self.spec
        if self.degraded:
            floor = spec.min_match if spec.min_match is not None else 1.0
            return None if match_score(group.tflops, spec.min_tflops) >= floor - 1e-9 else MATCH
        if spec.gpu_model is not None and group.model != spec.gpu_model:
            return MODEL
        if group.tflops < spec.min_tflops:
            return TFLOPS
        return None

    def is_full_match(self, group: Group) -> bool:
        spec = self.spec
        model_ok = spec.gpu_model is None or group.model == spec.gpu_model
        return model_ok and group.tflops >= spec.min_tflops

    def shape(self) -> tuple[object, ...]:
        spec = self.spec
        return (
            spec.gpu_model,
            spec.min_tflops,
            self.k,
            spec.memory_per_shard,
            spec.cpu_per_shard,
            self.model_path,
            self.dataset_path,
            spec.min_match if self.degraded else None,
            self.excluded,
            spec.priority,
        )
