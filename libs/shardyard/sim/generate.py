"""A seeded synthetic trace shaped like a shared training cluster's. Every shape has Poisson arrivals at the rate
at which the jobs drawn offer the cluster ``load`` (below), GPU models in proportion to the cluster's GPUs plus a
share of ``ANY``, and gang sizes never above what the cluster has of the job's kind.

The offered load is counted within the window of the arrivals: the GPU-seconds the jobs would use in it, each
starting on arrival, over the cluster's GPU-seconds in it. So at load 0.9 the cluster would be 90 % busy while jobs
arrive even were no job ever to wait, and at 1.1 work queues up. (Counting every job's whole run instead lets a few
multi-week jobs, which run on long after the last arrival, stand for load nobody offers while the others queue:
with the heavy-tailed shapes a "0.9" trace left the cluster about 30 % busy, and the policies differed by a few
per cent.)

The shapes (``SHAPES``):

- ``default``: gangs of {1, 2, 4, 8, 16}, skewed small; log-normal durations (median 30 min, clamped to
  1 min .. 6 h); priorities mostly 0, some 100 and a few 500 / 900; 15 % of the model-specific jobs opt into
  degraded placement (``min_match`` 0.4 after 15 min).
- ``philly``: after Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads"
  (USENIX ATC'19), Microsoft's Philly trace: durations heavy-tailed from minutes to weeks (log-normal, median
  15 min, sigma 2.0, clamped to 1 min .. 3 weeks: mean ~1.9 h); most jobs take 1 GPU, a few 8-64 (70 % 1 GPU;
  2, 4, 8, 16, 32, 64 at 10, 8, 7, 3, 1.5, 0.5 %); about 30 % of jobs fail, each after a uniform share of its run
  time (a failed job holds its GPUs until it fails). Priorities as ``default``; no degraded opt-ins.
- ``helios``: after Hu et al., "Characterization and Prediction of Deep Learning Workloads in Large-Scale GPU
  Datacenters" (SC'21), SenseTime's Helios traces: average run time 6,652 s against a median of 206 s
  (log-normal with median 206 s and sigma 2.64, which has that mean; clamped to 10 s .. 2 weeks), 3.7 GPUs per
  job on average (1, 2, 4, 8, 16, 32 GPUs at 60, 10, 10, 12, 5, 3 %: mean 3.9). Priorities as ``default``.

Same arguments, same seed -> the same trace.

``mark_elastic`` makes a share of a trace's rigid jobs elastic (``shardyard simulate --elastic-share``, at generation
or at replay): the jobs picked by a hash of their id, so the same jobs in every run, and a trace generated with a
share is the trace generated without it, replayed with that share.
"""

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate

from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.sim.cluster import NodeSpec
from shardyard.sim.trace import TraceJob

DEFAULT_LOAD = 0.95


@dataclass(frozen=True)
class Shape:
    sizes: tuple[int, ...]
    size_weights: tuple[float, ...]
    median_s: float
    sigma: float
    min_duration_s: float
    max_duration_s: float
    fail_share: float = 0.0
    """Jobs that fail: each runs a uniform share of its duration, then ends."""
    degraded_share: float = 0.0
    any_share: float = 0.2
    priorities: tuple[int, ...] = (0, 100, 500, 900)
    priority_weights: tuple[float, ...] = (0.70, 0.20, 0.08, 0.02)

    def mean_duration_s(self) -> float:
        """The log-normal's mean (the clamps move it a little)."""
        return self.median_s * math.exp(self.sigma**2 / 2)


HOUR, DAY = 3600.0, 86_400.0
SHAPES_BY_NAME = {
    "default": Shape((1, 2, 4, 8, 16), (0.40, 0.25, 0.17, 0.12, 0.06), 1800.0, 1.0, 60.0, 6 * HOUR, 0.0, 0.15),
    "philly": Shape(
        (1, 2, 4, 8, 16, 32, 64), (0.70, 0.10, 0.08, 0.07, 0.03, 0.015, 0.005), 900.0, 2.0, 60.0, 21 * DAY, 0.30
    ),
    "helios": Shape((1, 2, 4, 8, 16, 32), (0.60, 0.10, 0.10, 0.12, 0.05, 0.03), 206.0, 2.64, 10.0, 14 * DAY),
}
SHAPES = tuple(SHAPES_BY_NAME)
DEGRADED_MIN_MATCH = 0.4
DEGRADED_WAIT_S = 900.0


def _largest_fitting(size: int, capacity: int) -> int:
    while size > capacity and size > 1:
        size //= 2
    return size


def _check(count: int, load: float, nodes: Sequence[NodeSpec], shape: str) -> None:
    if count < 1:
        raise ValueError("generate at least one job")
    if not load > 0:
        raise ValueError("the offered load must be above 0")
    if not nodes:
        raise ValueError("the cluster has no nodes")
    if shape not in SHAPES_BY_NAME:
        raise ValueError(f"unknown shape {shape!r}; the shapes are {', '.join(SHAPES)}")


def generate(
    count: int,
    seed: int,
    nodes: Sequence[NodeSpec],
    *,
    load: float = DEFAULT_LOAD,
    catalogue: Mapping[str, float] = DEFAULT_TFLOPS,
    shape: str = "default",
    queues: Mapping[str, float] | None = None,
) -> list[TraceJob]:
    """``count`` jobs for ``nodes``; raises ValueError for a count below 1, a load not above 0, no nodes or an
    unknown shape. ``queues`` (name -> weight) spreads the jobs over queues in proportion to their weights."""
    _check(count, load, nodes, shape)
    teams = random.Random(f"{seed}/queues")  # apart too: a trace with queues has the same jobs as one without
    form = SHAPES_BY_NAME[shape]
    rng = random.Random(seed)
    owners = random.Random(f"{seed}/users")  # apart, so adding users left every other draw as it was
    per_model: dict[str, int] = {}
    for node in nodes:
        per_model[node.gpu_model] = per_model.get(node.gpu_model, 0) + node.gpus
    total = sum(per_model.values())
    models: list[str | None] = [*per_model, None]
    model_weights = [(1 - form.any_share) * gpus / total for gpus in per_model.values()] + [form.any_share]
    drawn: list[TraceJob] = []
    gaps: list[float] = []
    for number in range(1, count + 1):
        gaps.append(rng.expovariate(1.0) if number > 1 else 0.0)
        model = rng.choices(models, model_weights)[0]
        capacity = per_model[model] if model is not None else total
        gpus = _largest_fitting(rng.choices(form.sizes, form.size_weights)[0], capacity)
        duration = min(
            form.max_duration_s,
            max(form.min_duration_s, round(rng.lognormvariate(math.log(form.median_s), form.sigma))),
        )
        if form.fail_share and rng.random() < form.fail_share:
            duration = max(form.min_duration_s, round(duration * rng.random()))
        priority = rng.choices(form.priorities, form.priority_weights)[0]
        degraded = model is not None and rng.random() < form.degraded_share
        drawn.append(
            TraceJob(
                job_id=f"job-{number}",
                submit_s=0.0,
                gpus=gpus,
                gpu_model=model,
                duration_s=float(duration),
                priority=priority,
                min_tflops=catalogue[model] if model is not None else 0.0,
                min_match=DEGRADED_MIN_MATCH if degraded else None,
                max_wait_s=DEGRADED_WAIT_S if degraded else 0.0,
                user=f"user-{owners.randrange(USERS)}",
                queue=teams.choices(list(queues), list(queues.values()))[0] if queues else "",
            )
        )
    # Poisson arrivals, spread so that the jobs drawn offer exactly ``load`` within the window of their arrivals
    # (the drawn jobs' own figures, not the distribution's: with heavy tails they are far apart for thousands).
    places = list(accumulate(gaps))
    whole = places[-1] or 1.0
    shares = [place / whole for place in places]  # each arrival's place in the window, 0 .. 1
    span = window_for(load, total, [(job.gpus, job.duration_s) for job in drawn], shares) if count > 1 else 0.0
    return [replace(job, submit_s=round(share * span, 3)) for job, share in zip(drawn, shares, strict=True)]


def parse_queue_mix(text: str) -> dict[str, float]:
    """``team-a:3,team-b:1`` (a weight absent: 1) as name -> weight; raises ValueError naming the bad part."""
    mix: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, weight = part.partition(":")
        try:
            value = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"{part!r}: the weight is not a number") from None
        if not name or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{part!r}: write QUEUE[:WEIGHT] with a weight above 0")
        mix[name] = value
    if not mix:
        raise ValueError("name at least one queue")
    return mix


def offered_load(gpus: int, jobs: Sequence[tuple[int, float]], arrivals: Sequence[float], span_s: float) -> float:
    """The load ``jobs`` (GPUs, duration) arriving at ``arrivals`` offer ``gpus`` GPUs within ``[0, span_s]``, each
    job running from its arrival: GPU-seconds used in the window over the window's."""
    used = math.fsum(n * min(duration, max(span_s - at, 0.0)) for (n, duration), at in zip(jobs, arrivals, strict=True))
    return used / (gpus * span_s)


def window_for(load: float, gpus: int, jobs: Sequence[tuple[int, float]], shares: Sequence[float]) -> float:
    """The window in which ``jobs``, arriving at ``shares`` of it, offer ``gpus`` GPUs ``load`` (bisection: the
    wider the window, the lower the load, since each job's use in it grows at most as fast as the window)."""

    def load_in(span: float) -> float:
        return offered_load(gpus, jobs, [share * span for share in shares], span)

    low, high = 1.0, 1.0
    while load_in(high) > load:
        high *= 2
    while load_in(low) < load and low > 1e-6:
        low /= 2
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if load_in(middle) > load else (low, middle)
    return high


USERS = 20
"""Submitting users, uniformly (duration estimates are learned per user first)."""


def mark_elastic(jobs: Sequence[TraceJob], share: float, nodes: Sequence[NodeSpec]) -> list[TraceJob]:
    """``jobs`` with ``share`` (0..1) of the rigid ones made elastic, picked by a hash of the job id: ``min_shards``
    = max(1, gpus // 2), ``max_shards`` = 2 x gpus at most the GPUs of the nodes that can host the job (never
    below ``gpus``). Jobs already elastic, and the others, are left as they are. Raises ValueError for a share out
    of 0..1."""
    if not 0 <= share <= 1:
        raise ValueError("the elastic share must be within 0..1")
    marked = []
    for job in jobs:
        if job.min_shards is None and _draw(job.job_id) < share:
            room = sum(
                node.gpus
                for node in nodes
                if (job.gpu_model is None or node.gpu_model == job.gpu_model) and node.tflops >= job.min_tflops
            )
            job = replace(job, min_shards=max(1, job.gpus // 2), max_shards=max(job.gpus, min(2 * job.gpus, room)))
        marked.append(job)
    return marked


def _draw(job_id: str) -> float:
    """A number in [0, 1) fixed by ``job_id`` (a hash, evenly spread over ids that differ in a digit; not Python's
    ``hash``, which changes from run to run)."""
    digest = hashlib.blake2b(job_id.encode(), digest_size=8, person=b"elastic").digest()
    return int.from_bytes(digest) / 2**64
