"""Every job's goodput ledger as the monitor keeps it (``shardyard.goodput``), per team queue, and as metrics. Pure:
events in, ledgers and metric families out; the ``now`` of a running job's ledger is the reader's.

- ``shardyard_goodput_seconds_total{queue, part}``: the seconds of each part of the ledgers of the jobs that ended,
  summed per team queue (a job counts once it ended, with its whole ledger: a counter never goes back, while a
  running job's parts still move, a stall turning from productive into recovery when its fault is known);
- ``shardyard_goodput_ettr{queue}``: productive time over the whole, of the queue's jobs that ended;
  ``shardyard_goodput_cluster_ettr`` the same over every queue. Both are functions of the events folded, not of the
  clock, as every figure of a scrape is (the monitor keeps a rendering until the view changes).

A job's ledger, live, is on its detail in the status API (``/api/jobs/{id}``: ``goodput``). Once a job ended, its
ledger is a ``goodput`` span of its trace with a child span per stretch of one part (``trace_ledger``), sent by one
monitor replica (``MonitorHandlers``).
"""

from collections.abc import Iterator
from datetime import datetime

from shardyard import tracing
from shardyard.events import JobAccepted, ShardFailed, ShardProgress
from shardyard.goodput import PARTS, GoodputFold, Ledger, Part
from shardyard.lifecycle import LifecycleFact
from shardyard.monitor.exposition import Family


class GoodputBook:
    """Each job's goodput fold and, once accepted, its queue; the ledgers of jobs that ended are kept made (they
    change only with a shard's report read after the end)."""

    def __init__(self) -> None:
        self.folds: dict[str, GoodputFold] = {}
        self.queues: dict[str, str] = {}
        self._ended: dict[str, Ledger] = {}

    def lifecycle(self, event: LifecycleFact) -> None:
        if isinstance(event, JobAccepted):
            self.queues.setdefault(event.job_id, event.spec.queue)
        elif event.job_id not in self.folds:
            return  # a rejection: no job to account
        if self.folds.setdefault(event.job_id, GoodputFold()).apply(event):
            self._ended.pop(event.job_id, None)

    def shard(self, event: ShardProgress | ShardFailed) -> None:
        """A shard's step or failure; it may come before its job's acceptance (the topics are read side by side)."""
        if self.folds.setdefault(event.job_id, GoodputFold()).on_shard(event):
            self._ended.pop(event.job_id, None)

    def ledger(self, job_id: str, now: datetime) -> Ledger | None:
        """The job's ledger, to its end or to ``now``; None for a job never accepted (rejected, or unknown)."""
        fold = self.folds.get(job_id)
        if fold is None or fold.submitted_at is None:
            return None
        if fold.ended_at is None:
            return fold.ledger(now)
        made = self._ended.get(job_id)
        if made is None:
            made = self._ended[job_id] = fold.ledger(now)
        return made

    def by_queue(self) -> dict[str, dict[str, float]]:
        """Per queue, the seconds of each part of its jobs that ended."""
        ended: dict[str, dict[str, float]] = {}
        for job_id, fold in self.folds.items():
            if fold.submitted_at is None or fold.ended_at is None:
                continue
            ledger = self.ledger(job_id, fold.ended_at)
            assert ledger is not None
            sums = ended.setdefault(self.queues[job_id], dict.fromkeys((part.value for part in PARTS), 0.0))
            for part in PARTS:
                sums[part.value] += ledger.seconds(part)
        return ended


def goodput_families(book: GoodputBook) -> Iterator[Family]:
    ended = book.by_queue()
    seconds = Family(
        "shardyard_goodput_seconds",
        "Seconds of each part of the goodput ledger (queued, productive, recovery, recomputed, notice, degraded, "
        "straggler) of a team queue's jobs that ended",
        ["part", "queue"],
        kind="counter",
    )
    ettr = Family(
        "shardyard_goodput_ettr",
        "A team queue's effective-training-time ratio: productive time over the whole, of its jobs that ended",
        ["queue"],
    )
    cluster = Family(
        "shardyard_goodput_cluster_ettr",
        "The cluster's effective-training-time ratio: productive time over the whole, of every job that ended",
    )
    productive = total = 0.0
    for queue, sums in sorted(ended.items()):
        for part, value in sums.items():
            seconds.add((part, queue), value)
        whole = sum(sums.values())
        if whole > 0:
            ettr.add((queue,), sums[Part.PRODUCTIVE.value] / whole)
        productive, total = productive + sums[Part.PRODUCTIVE.value], total + whole
    if total > 0:
        cluster.add((), productive / total)
    yield from (seconds, ettr, cluster)


def trace_ledger(book: GoodputBook, job_id: str) -> None:
    """The ended job's ledger as spans of its trace: ``goodput`` over its life (its ETTR an attribute), with a child
    span per stretch of one part, named by the part."""
    fold = book.folds.get(job_id)
    ledger = book.ledger(job_id, fold.ended_at) if fold is not None and fold.ended_at is not None else None
    if fold is None or fold.ended_at is None or ledger is None:
        return
    stretches = [(segment.part.value, segment.start, segment.end) for segment in fold.segments(fold.ended_at)]
    ettr = {"shardyard.ettr": round(ledger.ettr, 6)} if ledger.ettr is not None else {}
    tracing.record_stretches(job_id, "goodput", stretches, attributes=ettr)
