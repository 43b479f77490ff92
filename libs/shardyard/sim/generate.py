"""A seeded synthetic trace shaped like a shared training cluster's:

- Poisson arrivals, at the rate that offers the cluster ``load`` x its GPU-seconds on average;
- gang sizes from {1, 2, 4, 8, 16}, skewed small (never more GPUs than the cluster has of the job's kind);
- GPU models in proportion to the cluster's GPUs, plus a share of ``ANY``;
- log-normal durations (median 30 min, clamped to 1 min .. 6 h);
- priorities mostly 0, some 100 and a few 500 / 900;
- a share of the model-specific jobs opts into degraded placement (``min_match`` 0.4 after 15 min).

Same arguments, same seed -> the same trace.
"""

import math
import random
from collections.abc import Mapping, Sequence

from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.sim.cluster import NodeSpec
from shardyard.sim.trace import TraceJob

SIZES = (1, 2, 4, 8, 16)
SIZE_WEIGHTS = (0.40, 0.25, 0.17, 0.12, 0.06)
PRIORITIES = (0, 100, 500, 900)
PRIORITY_WEIGHTS = (0.70, 0.20, 0.08, 0.02)
ANY_SHARE = 0.2
MEDIAN_S = 1800.0
SIGMA = 1.0
MIN_DURATION_S = 60.0
MAX_DURATION_S = 6 * 3600.0
DEGRADED_SHARE = 0.15
DEGRADED_MIN_MATCH = 0.4
DEGRADED_WAIT_S = 900.0
DEFAULT_LOAD = 0.95


def _largest_fitting(size: int, capacity: int) -> int:
    while size > capacity and size > 1:
        size //= 2
    return size


def generate(
    count: int,
    seed: int,
    nodes: Sequence[NodeSpec],
    *,
    load: float = DEFAULT_LOAD,
    catalogue: Mapping[str, float] = DEFAULT_TFLOPS,
) -> list[TraceJob]:
    """``count`` jobs for ``nodes``; raises ValueError for a count below 1, a load not above 0 or no nodes."""
    if count < 1:
        raise ValueError("generate at least one job")
    if not load > 0:
        raise ValueError("the offered load must be above 0")
    if not nodes:
        raise ValueError("the cluster has no nodes")
    rng = random.Random(seed)
    per_model: dict[str, int] = {}
    for node in nodes:
        per_model[node.gpu_model] = per_model.get(node.gpu_model, 0) + node.gpus
    total = sum(per_model.values())
    models: list[str | None] = [*per_model, None]
    model_weights = [(1 - ANY_SHARE) * gpus / total for gpus in per_model.values()] + [ANY_SHARE]
    mean_gpus = sum(size * weight for size, weight in zip(SIZES, SIZE_WEIGHTS, strict=True))
    mean_duration = MEDIAN_S * math.exp(SIGMA**2 / 2)
    rate = load * total / (mean_gpus * mean_duration)  # arrivals per second
    jobs: list[TraceJob] = []
    clock = 0.0
    for number in range(1, count + 1):
        if number > 1:
            clock += rng.expovariate(rate)
        model = rng.choices(models, model_weights)[0]
        capacity = per_model[model] if model is not None else total
        gpus = _largest_fitting(rng.choices(SIZES, SIZE_WEIGHTS)[0], capacity)
        duration = min(MAX_DURATION_S, max(MIN_DURATION_S, round(rng.lognormvariate(math.log(MEDIAN_S), SIGMA))))
        priority = rng.choices(PRIORITIES, PRIORITY_WEIGHTS)[0]
        degraded = model is not None and rng.random() < DEGRADED_SHARE
        jobs.append(
            TraceJob(
                job_id=f"job-{number}",
                submit_s=round(clock, 3),
                gpus=gpus,
                gpu_model=model,
                duration_s=float(duration),
                priority=priority,
                min_tflops=catalogue[model] if model is not None else 0.0,
                min_match=DEGRADED_MIN_MATCH if degraded else None,
                max_wait_s=DEGRADED_WAIT_S if degraded else 0.0,
            )
        )
    return jobs
