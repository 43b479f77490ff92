"""Whether a job could ever fit the cluster as it is: against its whole inventory, every node as if it were up,
undrained, idle and empty. A job that no set of nodes could hold waits ``NEVER_FITS`` (Kueue calls these
inadmissible) instead of a reason that running jobs ending, or a node coming back, would cure. Pure.

What counts is what no event but a node joining (or a node's hardware changing) would change: the GPU kinds the job
may ever use (its own model and TFLOPS, or down to its ``min_match`` floor where it opted in: ``filters``' group
filters, less its queue's quota, which admission judges), and each node's GPUs, memory and CPU in all. Load, disks,
artifacts, reservations, exclusions and ports pass: each of those comes and goes. A node whose view gives no totals
(only what is free) is not judged: it might hold the job.
"""

from collections import Counter

from shardyard.gpus import canonical_model
from shardyard.placement.candidate import Candidate
from shardyard.placement.filters import could_ever_use, cpu_shards, memory_shards
from shardyard.placement.index import ClusterIndex
from shardyard.placement.model import NodeView


def never_fits(index: ClusterIndex, job: Candidate) -> str | None:
    """Why no set of ``index``'s nodes could ever hold ``job``'s gang; None when some could (or there are no nodes
    yet: a cluster starting, whose nodes have not reported). O(nodes), once per job shape and cycle (the cycle keeps
    the verdict of a shape that did not fit)."""
    if not index.slots:
        return None
    fitting = 0
    gpus: Counter[str] = Counter()
    for slot in index.slots.values():
        view = slot.view
        gpus[canonical_model(view.gpu_model)] += view.gpu_total
        if could_ever_use(slot.group, job):
            if view.total_gpus < 0:
                return None  # a view that gives only what is free says nothing of what could be
            fitting += _all_it_could_take(view, job)
            if fitting >= job.k:
                return None
    spec = job.spec
    wanted = f"{job.k} x {spec.gpu_model or 'any GPU'} (>= {spec.min_tflops:g} TFLOPS)"
    held = ", ".join(f"{count} x {model}" for model, count in sorted(gpus.items()))
    return (
        f"no set of the cluster's {len(index.slots)} nodes could ever hold the gang of {wanted}, all of them idle: "
        f"at most {fitting} of its shards fit (the cluster's GPUs: {held})"
    )


def _all_it_could_take(view: NodeView, job: Candidate) -> int:
    """Shards of ``job`` the node could take empty: its GPUs, as far as its memory and CPU in all allow (a total it
    does not give does not limit)."""
    fits: float = view.total_gpus
    if view.total_memory_bytes >= 0:
        fits = min(fits, memory_shards(view.total_memory_bytes, job))
    if view.total_cpu_cores >= 0:
        fits = min(fits, cpu_shards(view.total_cpu_cores, job))
    return int(fits)
