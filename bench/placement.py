"""Placement engine throughput and per-decision latency at 100 / 1,000 / 5,000 / 10,000 nodes (prints JSON).

Each size gets a cluster of mixed GPU models (A100, V100, H100, L4; 4 or 8 GPUs a node; loads 0-60 %; zones and
racks) and the same backlog: 10,000 pending jobs of 1-16 GPUs, mixed models and priorities. One scheduling cycle
decides every job; each decision is timed on its own. Reported per size: decisions per second over the whole cycle
(indexing the snapshot included), per-decision latency p50/p99/max, the same for placements alone, and how many
jobs were placed.

Growth with cluster size is measured like for like. The backlog is the same at every size, so the first ``--head``
decisions of the cycle are the same jobs, placed on clusters of each size (100 nodes hold about 130 of them). Besides
the whole cycles, ``--head-trials`` short trials each build a fresh cycle at every size, back to back, and time only
its head decisions: a trial takes a fraction of a second, so each one samples every size under the same background
load (on a shared machine that load moves within seconds; a whole cycle per size takes about one). Each head decision
keeps its fastest time over the cycles and trials (the others carry the noise of a shared machine), and growth
compares the p50 and mean of those; the paired growth is the median, over trials, of each trial's ratio of head means.
Whole-backlog figures do not compare across sizes: at 100 nodes most of the 10,000 decisions are quick "does not fit"
answers, at 10,000 most are placements.

Targets (issue 3): >= 2,000 decisions/s and p99 < 5 ms at 5,000 nodes; per-decision latency growing < 10 % from
100 to 10,000 nodes.

    python bench/placement.py [--sizes 100,1000,5000,10000] [--jobs 10000] [--repeat 3] [--seed 1] [--head 100]
                              [--head-trials 30] [--smoke]
"""

import argparse
import gc
import json
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from shardyard.events import JobSpec, NodeStatus
from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.placement.cycle import PlacementCycle
from shardyard.placement.model import NodeView, PendingJob, Place, Policy, Snapshot
from smoke import parse_args

GIB = 1024**3
NOW = datetime(2026, 1, 1, tzinfo=UTC)
MODELS = (("A100", 0.4), ("V100", 0.3), ("H100", 0.2), ("L4", 0.1))
SIZES = ((1, 0.35), (2, 0.25), (4, 0.2), (8, 0.15), (16, 0.05))
DATASETS = tuple(f"/data/datasets/set-{i}" for i in range(8))
MODEL_DIRS = tuple(f"/data/models/base-{i}" for i in range(4))
SHARED = {path: "shared" for path in (*DATASETS, *MODEL_DIRS)}
SMOKE = {"sizes": "20,50", "jobs": 200, "repeat": 1, "head": 10, "head_trials": 2}


def _pick(rng: random.Random, weighted: tuple[tuple[Any, float], ...]) -> Any:
    return rng.choices([v for v, _ in weighted], weights=[w for _, w in weighted])[0]


def cluster(size: int, rng: random.Random) -> tuple[NodeView, ...]:
    nodes = []
    for i in range(size):
        model = _pick(rng, MODELS)
        gpus = 8 if rng.random() < 0.7 else 4
        artifacts = dict(SHARED)
        if rng.random() < 0.05:  # a few nodes cache a dataset on local disk
            artifacts[rng.choice(DATASETS)] = "local"
        nodes.append(
            NodeView(
                node_id=f"node-{i:05d}",
                status=NodeStatus.ALIVE if rng.random() > 0.01 else NodeStatus.SUSPECT,
                address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                gpu_model=model,
                tflops=DEFAULT_TFLOPS[model],
                free_gpus=tuple(range(gpus)),
                free_memory_bytes=gpus * 128 * GIB,
                free_cpu_cores=gpus * 12.0,
                cpu_load=rng.uniform(0.0, 0.6),
                rendezvous_ports=tuple(range(29500, 29508)),
                total_gpus=gpus,
                total_memory_bytes=gpus * 128 * GIB,
                total_cpu_cores=gpus * 12.0,
                artifacts=artifacts,
                zone=f"z{i % 4}",
                rack=f"r{i // 32}",
            )
        )
    return tuple(nodes)


def backlog(count: int, rng: random.Random) -> list[PendingJob]:
    jobs = []
    for i in range(count):
        gpus = _pick(rng, SIZES)
        model = _pick(rng, (*MODELS, (None, 0.15)))
        submitted = NOW - timedelta(seconds=rng.uniform(0, 3600))
        spec = JobSpec(
            job_id=f"job-{i:05d}",
            task_type="micro_train",
            priority=rng.choice((0, 0, 0, 1, 2, 5, 10)),
            gpu_count=gpus,
            gpu_model=model,
            min_tflops=DEFAULT_TFLOPS[model] if model else 0.0,
            memory_bytes=gpus * 64 * GIB,
            cpu_cores=gpus * 4.0,
            model_path=rng.choice(MODEL_DIRS),
            dataset_path=rng.choice(DATASETS),
            shard_count=gpus,
            sync_interval=100,
            max_steps=1000,
            batch_size=8,
            seq_len=64,
            lr=3e-3,
            seed=i,
            submitted_at=submitted,
            min_match=0.4 if rng.random() < 0.1 else None,
        )
        jobs.append(PendingJob(spec, submitted))
    return jobs


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def one_cycle(nodes: tuple[NodeView, ...], jobs: list[PendingJob]) -> dict[str, Any]:
    gc.collect()
    gc.disable()
    try:
        began = time.perf_counter()
        cycle = PlacementCycle(Snapshot(nodes), Policy(), now=NOW)
        indexed = time.perf_counter()
        latencies: list[float] = []
        order: list[str] = []
        placing: list[float] = []
        placed_gpus = 0
        for job in cycle.queue(jobs)[0]:
            t0 = time.perf_counter()
            decisions = cycle.decide(job)
            elapsed = time.perf_counter() - t0
            latencies.append(elapsed)
            order.append(job.spec.job_id)
            if isinstance(decisions[0], Place):
                placing.append(elapsed)
                placed_gpus += len(decisions[0].placements)
        ended = time.perf_counter()
    finally:
        gc.enable()
    return {
        "_latencies": latencies,
        "_order": order,
        "decisions": len(latencies),
        "placed_jobs": len(placing),
        "placed_gpus": placed_gpus,
        "index_ms": (indexed - began) * 1e3,
        "cycle_s": ended - began,
        "decisions_per_s": len(latencies) / (ended - began),
        "latency_ms": {
            "p50": _percentile(latencies, 0.5) * 1e3,
            "p99": _percentile(latencies, 0.99) * 1e3,
            "max": max(latencies) * 1e3,
        },
        "placement_latency_ms": {
            "p50": _percentile(placing, 0.5) * 1e3,
            "p99": _percentile(placing, 0.99) * 1e3,
        },
    }


def head_trial(nodes: tuple[NodeView, ...], head: list[PendingJob]) -> list[float]:
    """The latencies of a fresh cycle's first decisions, ``head`` (the backlog in queue order, cut short)."""
    gc.collect()
    gc.disable()
    try:
        cycle = PlacementCycle(Snapshot(nodes), Policy(), now=NOW)
        latencies: list[float] = []
        for job in head:
            t0 = time.perf_counter()
            cycle.decide(job)
            latencies.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000,5000,10000")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3, help="cycles per size; the median cycle is reported")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--head", type=int, default=100, help="decisions compared like for like across sizes")
    parser.add_argument("--head-trials", type=int, default=30, help="short trials timing the head decisions alone")
    args = parse_args(parser, SMOKE)
    sizes = [int(size) for size in args.sizes.split(",")]
    clusters = {size: cluster(size, random.Random(args.seed)) for size in sizes}
    jobs = backlog(args.jobs, random.Random(args.seed + 1))  # the same backlog at every size
    # Repeats interleave the sizes so that this machine's background noise falls on all of them alike.
    all_runs: dict[int, list[dict[str, Any]]] = {size: [] for size in sizes}
    for _ in range(args.repeat):
        for size in sizes:
            all_runs[size].append(one_cycle(clusters[size], jobs))
    head_jobs = PlacementCycle(Snapshot(()), Policy(), now=NOW).queue(jobs)[0][: args.head]  # the same at every size
    trials: dict[int, list[list[float]]] = {size: [] for size in sizes}
    for _ in range(args.head_trials):
        for size in sizes:
            trials[size].append(head_trial(clusters[size], head_jobs))
    results: dict[str, Any] = {}
    head_means: dict[int, list[float]] = {}
    for size, runs in all_runs.items():
        nodes = clusters[size]
        samples = [run["_latencies"] for run in runs] + trials[size]
        head = [min(sample[i] for sample in samples) for i in range(min(args.head, len(jobs)))]
        head_means[size] = [sum(trial) / len(trial) for trial in trials[size]]
        orders = {tuple(run.pop("_order")[: args.head]) for run in runs}
        assert len(orders) == 1, "the queue order must not vary between repeats"
        for run in runs:
            del run["_latencies"]
        runs.sort(key=lambda r: r["cycle_s"])
        results[str(size)] = {
            **runs[len(runs) // 2],
            "gpus": sum(n.gpu_total for n in nodes),
            "head_latency_ms": {
                "p50": _percentile(head, 0.5) * 1e3,
                "p99": _percentile(head, 0.99) * 1e3,
                "mean": sum(head) / len(head) * 1e3,
            },
            "_head_order": orders.pop(),
        }
    names = list(results)
    sizes_n = [int(name) for name in names]
    head_orders = {results[name].pop("_head_order") for name in names}
    assert len(head_orders) == 1, "the head jobs must be the same at every size"
    assert head_orders.pop() == tuple(job.spec.job_id for job in head_jobs), "the trials must time the cycles' head"
    first, last = results[names[0]]["head_latency_ms"], results[names[-1]]["head_latency_ms"]
    summary = {
        "from_nodes": sizes_n[0],
        "to_nodes": sizes_n[-1],
        "head_decisions": args.head,
        "head_p50_growth_pct": 100 * (last["p50"] / first["p50"] - 1),
        "head_mean_growth_pct": 100 * (last["mean"] / first["mean"] - 1),
        # Each trial times every size back to back: the median of those paired ratios shrugs off slow drifts.
        "paired_head_mean_growth_pct": {
            size: 100
            * (statistics.median(b / a for a, b in zip(head_means[sizes_n[0]], head_means[size], strict=True)) - 1)
            for size in sizes_n[1:]
        },
    }
    print(json.dumps({"bench": "placement", "jobs": args.jobs, "sizes": results, "growth": summary}, indent=2))


if __name__ == "__main__":
    main()
