"""The teams' queues as metrics (``monitor/queues.py``): per queue and GPU model the nominal quota and the GPUs
used, borrowed, lent and pending; per queue its pending jobs, fair share, and since when it starves (what
``QUEUE_STARVED`` and its Prometheus twin judge)."""

from collections.abc import Iterator

from shardyard.monitor.exposition import Family
from shardyard.monitor.views import ClusterView

KINDS = ("nominal", "used", "borrowed", "lent", "pending")


def queue_families(view: ClusterView) -> Iterator[Family]:
    rows = view.queue_rows()
    gpus = Family(
        "shardyard_queue_gpus",
        "A team queue's GPUs per model: nominal quota, used by its running jobs, borrowed from its cohort, lent to "
        "it, and pending (asked for by its waiting jobs)",
        ["kind", "model", "queue"],
    )
    pending = Family("shardyard_queue_pending_jobs", "A team queue's jobs not placed yet", ["queue"])
    share = Family(
        "shardyard_queue_fair_share",
        "A team queue's weighted dominant share of the cluster (TFLOPS-weighted GPUs, CPU, memory): lowest goes first",
        ["queue"],
    )
    starving = Family(
        "shardyard_queue_starving_since_timestamp_seconds",
        "Unix time since which a team queue has had a job that fits in its nominal quota waiting (absent: none)",
        ["queue"],
    )
    limit = Family(
        "shardyard_queue_starving_after_seconds",
        "How long a team queue may wait for its nominal quota before QUEUE_STARVED (the queues file's)",
    )
    for name, row in rows.items():
        for model, figures in row.models.items():
            for kind in KINDS:
                if kind in figures:
                    gpus.add((kind, model, name), figures[kind])
        pending.add((name,), row.pending_jobs)
        share.add((name,), row.fair_share)
        if row.starving_since is not None:
            starving.add((name,), row.starving_since.timestamp())
    if view.queues is not None:
        limit.add((), view.queues.config.starving_after_s)
    yield from (gpus, pending, share, starving, limit)
