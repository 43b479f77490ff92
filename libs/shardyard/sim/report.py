"""The figures of one simulated run, and their table and JSON forms.

- JCT (job completion time) = finish - submit; queueing delay = first start - submit; both over completed jobs.
- p50/p95/p99 are nearest-rank percentiles: the smallest value with at least that share of the values at or below
  it.
- makespan = last finish - first submit; GPU utilisation = GPU-seconds held by gangs (checkpointing included) /
  (cluster GPUs x makespan).
- GPU-hours lost to preemption, and its parts (``sim.lost_work``): stopping (from the notice to the release: writing
  the checkpoint, or running on to the deadline), restart, and recomputed work (progress before the notice past the
  checkpoint kept).
- GPU utilisation while jobs arrive (``gpu_utilisation_arrivals``, JSON only): GPU-seconds held within the window
  of the arrivals (first to last submission) / (cluster GPUs x that window): the window in which the generator
  counts the offered load, so that a tail of long jobs after the last arrival does not set it.
- resizes: re-formations of elastic gangs at a new size (``sim.gang``), and the GPU-hours their pauses held
  without progress (``resize_gpu_h``; not lost to preemption).
- ETTR, the fleet's effective training time ratio, GPU-weighted over completed jobs: sum of GPUs x productive run
  time (run time that advanced work not done before) / sum of GPUs x JCT. Waiting, restarts, stopping and
  recomputed work all count against it; 1 only when every job ran from submission to end without a stop.
- the verdict: the project's own policy's mean JCT against every other policy run (their ratio) and their mean
  waits, in one line; where it did worse, it says so.
- per queue (a trace with a ``queue`` column): its jobs' JCT and wait as above and, given a queues file, its share
  of its entitlement while it had jobs waiting; ``jain_index`` is Jain's index over those shares (``sim.fairness``).
"""

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from shardyard.quotas import DEFAULT_QUEUE
from shardyard.sim.defaults import OWN_POLICY
from shardyard.sim.engine import US, Outcome, SimResult
from shardyard.sim.fairness import jain
from shardyard.text_table import table

GPU_HOUR_US = 3600 * US


@dataclass(frozen=True)
class Summary:
    policy: str
    jobs: int
    completed: int
    unfinished: int
    """Jobs still pending or running when no event was left (they can never fit this cluster under the policy)."""
    avg_jct_s: float
    p50_jct_s: float
    p95_jct_s: float
    p99_jct_s: float
    avg_wait_s: float
    p50_wait_s: float
    p95_wait_s: float
    p99_wait_s: float
    makespan_s: float
    gpu_utilisation: float
    preemptions: int
    degraded_placements: int
    lost_gpu_h_preemption: float
    """GPU-hours lost to preemption: the three parts below."""
    lost_gpu_h_stopping: float
    lost_gpu_h_restart: float
    lost_gpu_h_recomputed: float
    ettr: float
    """The fleet's effective training time ratio (see the module's doc); 0 when no job completed."""
    queues: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per queue (when the trace names more than one, or a queues file was given): jobs, completed, avg and p95 JCT
    and wait, and ``share_of_entitlement``."""
    jain_index: float | None = None
    """Jain's index over the queues' shares of their entitlement (None: no queues file)."""
    resizes: int = 0
    """Re-formations of elastic gangs at a new size."""
    resize_gpu_h: float = 0.0
    """GPU-hours of their pauses (no progress; not lost to preemption)."""
    gpu_utilisation_arrivals: float = 0.0
    """GPU utilisation within the window of the arrivals (see the module's doc); 0 when all arrive at once."""


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0 < q <= 100) of ``values``; 0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def _times(outcomes: Sequence[Outcome]) -> tuple[list[Outcome], list[float], list[float]]:
    done = [o for o in outcomes if o.finish_us is not None and o.first_start_us is not None]
    jct = [o.finish_us / US - o.job.submit_s for o in done if o.finish_us is not None]
    wait = [o.first_start_us / US - o.job.submit_s for o in done if o.first_start_us is not None]
    return done, jct, wait


def _per_queue(result: SimResult) -> dict[str, dict[str, float]]:
    by_queue: dict[str, list[Outcome]] = {}
    for outcome in result.outcomes:
        by_queue.setdefault(outcome.job.queue or DEFAULT_QUEUE, []).append(outcome)
    if len(by_queue) < 2 and not result.shares:
        return {}
    out = {}
    for queue, outcomes in sorted(by_queue.items()):
        done, jct, wait = _times(outcomes)
        out[queue] = {
            "jobs": len(outcomes),
            "completed": len(done),
            "avg_jct_s": _mean(jct),
            "p95_jct_s": percentile(jct, 95),
            "avg_wait_s": _mean(wait),
            "p95_wait_s": percentile(wait, 95),
        }
        if queue in result.shares:
            out[queue]["share_of_entitlement"] = result.shares[queue]
    return out


def summarize(result: SimResult) -> Summary:
    done, jct, wait = _times(result.outcomes)
    submits = [o.job.submit_s for o in result.outcomes]
    last = max((o.finish_us for o in done if o.finish_us is not None), default=None)
    makespan = last / US - min(submits) if last is not None and submits else 0.0
    capacity = result.total_gpus * makespan
    spent = result.spent
    return Summary(
        policy=result.policy,
        jobs=len(result.outcomes),
        completed=len(done),
        unfinished=len(result.outcomes) - len(done),
        avg_jct_s=_mean(jct),
        p50_jct_s=percentile(jct, 50),
        p95_jct_s=percentile(jct, 95),
        p99_jct_s=percentile(jct, 99),
        avg_wait_s=_mean(wait),
        p50_wait_s=percentile(wait, 50),
        p95_wait_s=percentile(wait, 95),
        p99_wait_s=percentile(wait, 99),
        makespan_s=makespan,
        gpu_utilisation=result.busy_gpu_s / capacity if capacity > 0 else 0.0,
        preemptions=result.preemptions,
        degraded_placements=result.degraded_placements,
        lost_gpu_h_preemption=spent.lost / GPU_HOUR_US,
        lost_gpu_h_stopping=spent.stopping / GPU_HOUR_US,
        lost_gpu_h_restart=spent.restart / GPU_HOUR_US,
        lost_gpu_h_recomputed=spent.recomputed / GPU_HOUR_US,
        ettr=ettr(done),
        queues=_per_queue(result),
        jain_index=jain(result.shares.values()) if result.shares else None,
        resizes=result.resizes,
        resize_gpu_h=spent.resizing / GPU_HOUR_US,
        gpu_utilisation_arrivals=_busy_share(result, min(submits, default=0.0), max(submits, default=0.0)),
    )


def _busy_share(result: SimResult, start_s: float, end_s: float) -> float:
    """The share of the cluster's GPU-time within ``[start_s, end_s]`` held by gangs (0 for an empty window)."""
    start, end = round(start_s * US), round(end_s * US)
    samples = result.busy_gpus
    if end <= start or result.total_gpus == 0 or not samples:
        return 0.0
    held = 0
    for (at, gpus), (later, _next) in zip(samples, (*samples[1:], (end, 0)), strict=True):
        held += gpus * max(0, min(later, end) - max(at, start))
    return held / (result.total_gpus * (end - start))


def ettr(done: Sequence[Outcome]) -> float:
    """GPUs x productive run time / GPUs x JCT, summed over ``done`` (completed jobs); 0 for none."""
    wall = math.fsum(o.job.gpus * (o.finish_us / US - o.job.submit_s) for o in done if o.finish_us is not None)
    productive = math.fsum(o.job.gpus * o.productive_us / US for o in done)
    return productive / wall if wall > 0 else 0.0


def _seconds(value: float) -> str:
    return f"{value:,.1f}"


def render_table(summaries: Sequence[Summary]) -> str:
    rows = [
        [
            s.policy,
            f"{s.completed}/{s.jobs}",
            _seconds(s.avg_jct_s),
            _seconds(s.p50_jct_s),
            _seconds(s.p99_jct_s),
            _seconds(s.avg_wait_s),
            _seconds(s.p50_wait_s),
            _seconds(s.p99_wait_s),
            _seconds(s.makespan_s),
            f"{s.gpu_utilisation:.1%}",
            str(s.resizes),
            str(s.preemptions),
            f"{s.lost_gpu_h_preemption:,.1f}",
            f"{s.ettr:.3f}",
            str(s.degraded_placements),
        ]
        for s in summaries
    ]
    headers = [
        "POLICY",
        "DONE",
        "AVG JCT s",
        "P50 JCT s",
        "P99 JCT s",
        "AVG WAIT s",
        "P50 WAIT s",
        "P99 WAIT s",
        "MAKESPAN s",
        "GPU UTIL",
        "RESIZES",
        "PREEMPT",
        "LOST GPU-h",
        "ETTR",
        "DEGRADED",
    ]
    shown = table(rows, headers)
    queues = [s for s in summaries if s.queues]
    return shown + ("\n\n" + queue_table(queues) if queues else "")


def queue_table(summaries: Sequence[Summary]) -> str:
    """Per policy and queue: JCT, wait and share of entitlement; and each policy's Jain's index."""
    rows = []
    for s in summaries:
        for queue, q in s.queues.items():
            share = q.get("share_of_entitlement")
            rows.append(
                [
                    s.policy,
                    queue,
                    f"{int(q['completed'])}/{int(q['jobs'])}",
                    _seconds(q["avg_jct_s"]),
                    _seconds(q["p95_jct_s"]),
                    _seconds(q["avg_wait_s"]),
                    _seconds(q["p95_wait_s"]),
                    "-" if share is None else f"{share:.3f}",
                    "-" if s.jain_index is None else f"{s.jain_index:.3f}",
                ]
            )
    headers = ["POLICY", "QUEUE", "DONE", "AVG JCT s", "P95 JCT s", "AVG WAIT s", "P95 WAIT s", "SHARE", "JAIN"]
    return table(rows, headers)


def verdict(summaries: Sequence[Summary], own: str = OWN_POLICY) -> str:
    """One line, ``verdict: ...``: by how much ``own`` cut (or raised) the mean JCT against each other policy, and
    the policies' mean waits (``: lower`` marks one below ``own``'s); mean JCT and wait are over completed jobs, so
    it names unfinished jobs too."""
    mine = next((s for s in summaries if s.policy == own), None)
    others = [s for s in summaries if s.policy != own]
    if mine is None:
        return f"verdict: none: the {own} policy was not run (add --policy {own} to compare it)"
    if not others:
        return f"verdict: none: no other policy was run to compare {own} with"
    if mine.completed == 0:
        return f"verdict: {own} completed no job, so its JCT cannot be compared"
    cut: list[tuple[str, float]] = []
    worse: list[tuple[str, float]] = []
    same: list[str] = []
    for other in (s for s in others if s.completed):
        low, high = sorted((mine.avg_jct_s, other.avg_jct_s))
        ratio = high / low if low > 0 else math.inf if high > 0 else 1.0
        if ratio < 1.005:
            same.append(other.policy)
        else:
            (cut if other.avg_jct_s > mine.avg_jct_s else worse).append((other.policy, ratio))
    said = []
    if cut:
        said.append("cut the mean JCT " + _and([f"{_ratio(r)} against {name}" for name, r in cut]))
    if worse:
        ratios = _and([_ratio(r) for _name, r in worse])
        said.append(f"was worse than {_and([name for name, _r in worse])}: mean JCT {ratios} higher")
    if same:
        said.append(f"matched the mean JCT of {_and(same)}")
    idle = [s.policy for s in others if not s.completed]
    if idle:
        said.append(f"completed jobs where {_and(idle)} completed none")
    waits = ", ".join(
        f"{_wait(s.avg_wait_s)} s ({s.policy}{': lower' if s.avg_wait_s * 1.005 < mine.avg_wait_s else ''})"
        for s in others
        if s.completed
    )
    line = (
        f"verdict: {own} "
        + "; it ".join(said)
        + (f"; mean wait {_wait(mine.avg_wait_s)} s vs {waits}" if waits else "")
    )
    if any(s.unfinished != mine.unfinished for s in others):
        line += "; unfinished jobs: " + ", ".join(f"{s.unfinished} ({s.policy})" for s in (mine, *others))
    return line


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _ratio(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio < 1.1 else f"{ratio:.1f}x" if ratio < 100 else f"{ratio:,.0f}x"


def _wait(seconds: float) -> str:
    return f"{seconds:,.0f}" if seconds >= 100 else f"{seconds:.1f}"


def as_json(summaries: Sequence[Summary], **context: Any) -> dict[str, Any]:
    """``context`` (trace, cluster, ...) first, then ``policies``: name -> figures, rounded to the millisecond; then
    the ``verdict`` line."""
    policies: dict[str, dict[str, Any]] = {}
    for summary in summaries:
        figures = asdict(summary)
        del figures["policy"]
        queues, jain_index = figures.pop("queues"), figures.pop("jain_index")
        shown = {
            k: round(v, 6 if k in ("gpu_utilisation", "gpu_utilisation_arrivals", "ettr") else 3)
            for k, v in figures.items()
        }
        if queues:
            shown["queues"] = {q: {k: round(v, 4) for k, v in row.items()} for q, row in queues.items()}
        if jain_index is not None:
            shown["jain_index"] = round(jain_index, 4)
        policies[summary.policy] = shown
    return {**context, "policies": policies, "verdict": verdict(summaries)}
