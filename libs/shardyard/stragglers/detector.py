"""Which rank of a synchronous gang holds the others back, and why, from the shards' progress reports. Pure.

In synchronous data parallelism every rank waits for the slowest at each collective, so the ranks share their step
time (``ShardProgress.step_ms``); what sets a straggler apart is its **own** time in a step, its waits on the gang
left out (``compute_ms``). Per gang attempt:

- **Slow node** (``SLOW_NODE``). A rank whose own time stays above ``bounds.ratio`` times the median of the other
  ranks' (each rank's newest report) for ``bounds.window_s``, over ``bounds.min_reports`` reports in a row, and also
  per sample (``compute_ms`` over the samples it took a step). One report within the bound starts the count again:
  a loaded host's passing stall is not a straggler.
- **Imbalanced job** (``IMBALANCED_JOB``). The same, per step only: per sample the rank is as fast as the others.
  Its slice of the batch is larger (uneven slices), or its data costs more: moving it would change nothing.
  A gang whose ranks are all slow has no outlier and is not judged here.
- **Slow link** (``SLOW_LINK``). No rank's own time is out of line, yet the gang waits more than it computes
  (``step_ms`` above ``ratio`` times the largest ``compute_ms``, over the window) and a measured link between two
  of its nodes is slow (``shardyard.links.slow_links``): the link is named, not a node.

A verdict is given once per gang attempt and rank (or link); a new attempt starts afresh. Nothing here acts: the
fault manager publishes the verdict and the scheduler decides the swap.
"""

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from shardyard.events import ShardProgress, StragglerKind

RATIO: Final = 1.4
WINDOW_S: Final = 20.0
MIN_REPORTS: Final = 5


Kind = StragglerKind


@dataclass(frozen=True)
class Bounds:
    ratio: float = RATIO
    window_s: float = WINDOW_S
    min_reports: int = MIN_REPORTS


@dataclass(frozen=True)
class Straggler:
    job_id: str
    attempt: int
    kind: Kind
    shard_index: int | None
    """The slow rank (None for a slow link)."""
    node_id: str
    """The slow rank's node, or a slow link's first end."""
    peer_id: str | None
    """A slow link's other end."""
    ratio: float
    """How much slower than the rest of the gang: own time (slow node, imbalanced job) or wait over compute (link)."""
    since: datetime
    """The first report of the run that crossed the bound."""
    detail: str


@dataclass(frozen=True)
class Report:
    at: datetime
    node_id: str
    compute_ms: float
    step_ms: float
    samples_per_step: float


@dataclass
class _Run:
    """Reports in a row above the bound: since when, how many."""

    since: datetime
    reports: int = 1


@dataclass
class _Gang:
    newest: dict[int, Report] = field(default_factory=dict)
    runs: dict[int | None, _Run] = field(default_factory=dict)
    """By rank (None: the gang's waits, for a slow link)."""
    judged: set[int | None] = field(default_factory=set)


SlowLinks = Callable[[set[str], datetime], Iterable[tuple[str, str, str]]]
"""The slow links among these nodes now, each as (one end, the other, what is slow), slowest first."""


def report_of(event: ShardProgress) -> Report | None:
    """The figures a progress report gives the detector; None when it carries none (an earlier runner)."""
    if event.compute_ms <= 0 or event.step_ms <= 0:
        return None
    samples = event.samples_per_s * event.step_ms / 1000.0
    return Report(event.occurred_at, event.node_id, event.compute_ms, event.step_ms, samples)


class Detector:
    def __init__(self, bounds: Bounds | None = None, slow_links: SlowLinks | None = None) -> None:
        self.bounds = bounds or Bounds()
        self._slow_links = slow_links
        self._gangs: dict[tuple[str, int], _Gang] = {}

    def observe(self, event: ShardProgress) -> Straggler | None:
        """Take one progress report; a verdict when it completes one (see the module's doc)."""
        report = report_of(event)
        if report is None:
            return None
        for key in [k for k in self._gangs if k[0] == event.job_id and k[1] < event.attempt]:
            del self._gangs[key]  # a newer attempt: the old gang is gone
        gang = self._gangs.setdefault((event.job_id, event.attempt), _Gang())
        first = event.shard_index not in gang.newest
        gang.newest[event.shard_index] = report
        if first or len(gang.newest) < 2:
            return None  # an attempt's first report covers its start-up too
        found = self._rank(gang, event, report)
        return found if found is not None else self._link(gang, event, report)

    def forget(self, job_id: str) -> None:
        for key in [k for k in self._gangs if k[0] == job_id]:
            del self._gangs[key]

    def _rank(self, gang: _Gang, event: ShardProgress, report: Report) -> Straggler | None:
        others = [r for rank, r in gang.newest.items() if rank != event.shard_index]
        typical = statistics.median(r.compute_ms for r in others)
        ratio = report.compute_ms / typical if typical > 0 else 0.0
        if not self._held(gang, event.shard_index, report.at, ratio > self.bounds.ratio):
            return None
        gang.judged.add(event.shard_index)
        per_sample = statistics.median(r.compute_ms / r.samples_per_step for r in others if r.samples_per_step > 0)
        own = report.compute_ms / report.samples_per_step if report.samples_per_step > 0 else 0.0
        slow_per_sample = per_sample > 0 and own > self.bounds.ratio * per_sample
        kind = Kind.SLOW_NODE if slow_per_sample else Kind.IMBALANCED_JOB
        since = gang.runs[event.shard_index].since
        what = "its own time" if slow_per_sample else "its own time per step, not per sample (a larger slice)"
        detail = (
            f"rank {event.shard_index} on {report.node_id}: {report.compute_ms:.0f} ms a step of {what}, "
            f"{ratio:.2f}x the gang's {typical:.0f} ms, for {(report.at - since).total_seconds():.0f} s"
        )
        rank = event.shard_index
        return Straggler(event.job_id, event.attempt, kind, rank, report.node_id, None, ratio, since, detail)

    def _link(self, gang: _Gang, event: ShardProgress, report: Report) -> Straggler | None:
        if self._slow_links is None:
            return None
        slowest_own = max(r.compute_ms for r in gang.newest.values())
        ratio = report.step_ms / slowest_own if slowest_own > 0 else 0.0
        if not self._held(gang, None, report.at, ratio > self.bounds.ratio):
            return None
        nodes = {r.node_id for r in gang.newest.values()}
        link = next(iter(self._slow_links(nodes, report.at)), None)
        if link is None:
            gang.runs.pop(None, None)  # waits without a slow link: the gang's own collectives, not judged here
            return None
        gang.judged.add(None)
        a, b, what = link
        since = gang.runs[None].since
        detail = (
            f"the gang waits {ratio:.2f}x what its slowest rank computes ({report.step_ms:.0f} ms a step against "
            f"{slowest_own:.0f} ms) and its link {a} <-> {b} is slow: {what}"
        )
        return Straggler(event.job_id, event.attempt, Kind.SLOW_LINK, None, a, b, ratio, since, detail)

    def _held(self, gang: _Gang, who: int | None, at: datetime, slow: bool) -> bool:
        """Count one report of ``who`` above the bound (``slow``) or end its run; whether the run now makes a
        verdict not given before."""
        if not slow:
            gang.runs.pop(who, None)
            return False
        run = gang.runs.get(who)
        if run is None:
            gang.runs[who] = run = _Run(at)
        else:
            run.reports += 1
        long_enough = (at - run.since).total_seconds() >= self.bounds.window_s
        return long_enough and run.reports >= self.bounds.min_reports and who not in gang.judged
