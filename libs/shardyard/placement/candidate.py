"""A pending job as one placement decision sees it: what its filters read (``filters``), the groups it may use, and
its queue order (priority, then least attained service or aging) and whom it may preempt. Pure."""

import bisect
from datetime import datetime

from shardyard.events import PendingReason
from shardyard.gpus import match_score
from shardyard.placement.filters import group_filters
from shardyard.placement.index import ClusterIndex, norm_path
from shardyard.placement.model import (
    PendingJob,
    Policy,
    RunningJob,
    epoch_us,
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


def las_queue(attained_gpu_s: float, policy: Policy) -> int:
    """The LAS queue of a job that has run ``attained_gpu_s`` GPU-seconds: 0 below the first threshold."""
    return bisect.bisect_right(policy.las_thresholds_gpu_s, attained_gpu_s)


def pending_queue(job: PendingJob, policy: Policy, now: datetime) -> int:
    """A pending job's LAS queue, back to 0 once it has waited ``starve_factor`` times as long as it ran
    (Tiresias's starvation guard: a long job preempted by a stream of short ones still gets its turn)."""
    queue = las_queue(job.attained_gpu_s, policy)
    if queue == 0:
        return 0
    ran_s = job.attained_gpu_s / max(1, job.spec.gpu_count)
    waited_s = (now - job.ready_at).total_seconds()
    return 0 if waited_s >= policy.starve_factor * ran_s else queue


def running_queue(gang: RunningJob, policy: Policy, now: datetime) -> int:
    """A running gang's LAS queue now: its earlier attempts plus this one's run time, on all its GPUs."""
    ran_s = max(0.0, (epoch_us(now) - gang.started_us) / 1e6)
    return las_queue(gang.attained_gpu_s + gang.gpu_count * ran_s, policy)


QueueKey = tuple[float, int, datetime, str]


def queue_key(job: PendingJob, policy: Policy, now: datetime) -> QueueKey:
    """Where ``job`` stands in the queue (smallest first), by ``policy.order``: priority, then LAS queue (``las``)
    or priority with aging (``aging``), then the longest ready, then the job id."""
    if policy.order == "aging":
        return -effective_priority(job, policy, now), 0, job.ready_at, job.spec.job_id
    return -float(job.spec.priority), pending_queue(job, policy, now), job.ready_at, job.spec.job_id


def outranks(job: PendingJob, gang: RunningJob, policy: Policy, now: datetime) -> bool:
    """Whether ``job`` may preempt ``gang``: a higher priority; or, under ``las``, the same priority from an earlier
    LAS queue, once the gang has run ``min_runtime_s`` in its attempt. The rule for one job and one gang: a cycle
    applies it to all its gangs at once through ``contention.victim_order`` (a test holds the two together)."""
    if gang.priority < job.spec.priority:
        return True
    if policy.order != "las" or gang.priority != job.spec.priority:
        return False
    if (now - gang.started_at).total_seconds() < policy.min_runtime_s:
        return False
    return running_queue(gang, policy, now) > pending_queue(job, policy, now)


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
        "quota_models",
        "spec",
    )

    def __init__(
        self, job: PendingJob, index: ClusterIndex, now: datetime, quota_models: frozenset[str] | None = None
    ) -> None:
        self.pending = job
        self.quota_models = quota_models
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
            spec.queue,
            spec.elasticity,
        )
