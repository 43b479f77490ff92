"""Whether a trace's demand fits the cluster it is replayed on: the warnings ``shardyard simulate`` prints before
its figures, so a trace made for another cluster is not replayed in silence.

- **Jobs that can never start**: a gang larger than every GPU the cluster has of its kind (its model, at least its
  ``min_tflops``); every policy passes them over, and they end the replay still pending.
- **Models the cluster lacks**: jobs asking for a GPU model no node has.
- **Overload**: the trace's offered load on this cluster (``shardyard.sim.generate.offered_load``: the GPU-seconds
  its jobs would use within the window of their arrivals, each starting on arrival, over the cluster's) above
  ``OVERLOAD``. The generator aims at 0.95 for the cluster it was given; a load of 4.8 says the trace was made for
  about five times these GPUs, and every queue only grows. The warning names that size.
"""

from collections.abc import Sequence
from typing import Final

from shardyard.sim.cluster import NodeSpec
from shardyard.sim.generate import offered_load
from shardyard.sim.trace import TraceJob

OVERLOAD: Final = 1.5
"""Offered load above which the trace is said not to fit (a load near 1 is a busy cluster, not a wrong one)."""
NAMED: Final = 3
"""Job ids named in a warning; the rest are counted."""


def _capacity(job: TraceJob, nodes: Sequence[NodeSpec]) -> int:
    """The GPUs of a full match for ``job``, as the simulator's ``eligible`` counts them."""
    return sum(
        node.gpus
        for node in nodes
        if (job.gpu_model is None or node.gpu_model == job.gpu_model) and node.tflops >= job.min_tflops
    )


def _named(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:NAMED])
    return shown if len(ids) <= NAMED else f"{shown} and {len(ids) - NAMED} more"


def fit_warnings(trace: Sequence[TraceJob], nodes: Sequence[NodeSpec]) -> list[str]:
    """What does not fit (see the module's doc); empty when the trace suits the cluster."""
    if not trace or not nodes:
        return []
    warnings = []
    models = {node.gpu_model for node in nodes}
    absent = sorted({job.gpu_model for job in trace if job.gpu_model is not None and job.gpu_model not in models})
    if absent:
        asking = [job.job_id for job in trace if job.gpu_model in absent]
        warnings.append(
            f"{len(asking)} jobs ask for {', '.join(absent)}, which the cluster has none of ({_named(asking)})"
        )
    too_big = [job for job in trace if job.gpu_model in models or job.gpu_model is None]
    too_big = [job for job in too_big if _capacity(job, nodes) < job.gpus]
    if too_big:
        largest = max(too_big, key=lambda job: job.gpus)
        warnings.append(
            f"{len(too_big)} jobs can never start: their gang is larger than the cluster's GPUs of its kind (the "
            f"largest, {largest.job_id}, needs {largest.gpus} GPUs, the cluster has {_capacity(largest, nodes)}): "
            f"{_named([job.job_id for job in too_big])}"
        )
    gpus = sum(node.gpus for node in nodes)
    start = min(job.submit_s for job in trace)
    # A trace submitted all at once is measured over its longest job: the load of having every job run at once.
    span = max(job.submit_s for job in trace) - start or max(job.duration_s for job in trace)
    if span > 0:
        load = offered_load(
            gpus, [(job.gpus, job.duration_s) for job in trace], [job.submit_s - start for job in trace], span
        )
        if load > OVERLOAD:
            warnings.append(
                f"the trace offers this cluster a load of {load:.1f} ({gpus} GPUs; the generator aims at 0.95): it "
                f"looks made for about {round(gpus * load / 0.95, -1):.0f} GPUs, and every queue only grows; give "
                "the cluster it was made for with --cluster"
            )
    return warnings
