"""Which rank of a synchronous gang holds the others back, and why, from the shards' progress reports. Pure.

In synchronous data parallelism every rank waits for the slowest at each collective, so the ranks share their step
time (``ShardProgress.step_ms``); what sets a straggler apart is its **own** time in a step, its waits on the gang
left out (``compute_ms``). Per gang attempt:

- **Slow node** (``SLOW_NODE``). A rank that stays slower than the others over the last ``bounds.window_s`` (its
  reports covering the window, ``bounds.min_reports`` at least): the median of its own times there is above
  ``bounds.ratio`` times the typical rank's (the median of the other ranks' medians over the same window), and so
  are ``bounds.share`` of its reports (four in five); also per sample (``compute_ms`` over the samples it took a
  step). Medians over a window, not single reports: a rank's own time is a few milliseconds on a busy CPU host,
  where one report in three can be off by half. A loaded host's passing stall, shorter than most of the window, is
  not a straggler.
- **Imbalanced job** (``IMBALANCED_JOB``). The same, per step only: per sample the rank is as fast as the others.
  Its slice of the batch is larger (uneven slices), or its data costs more: moving it would change nothing.
  A gang whose ranks are all slow has no outlier and is not judged here.
- **Slow link** (``SLOW_LINK``). No rank's own time is out of line, yet the gang waits longer than it did: its wait
  a step (``step_ms`` less the slowest rank's ``compute_ms``) is above ``ratio`` times its baseline (the median of
  its first ``BASELINE_REPORTS`` reports) and ``MIN_EXTRA_WAIT_MS`` more, over the window, and a measured link
  between two of its nodes is slow (``shardyard.links.slow_links``): the link is named, not a node. (Waiting longer
  than it computes is no sign: on a loaded host, or with a large model on a thin link, a gang may always wait more
  than it computes.)

A verdict is given once per gang attempt and rank (or link); a new attempt starts afresh. Nothing here acts: the
fault manager publishes the verdict and the scheduler decides the swap.
"""

import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from shardyard.events import ShardProgress, StragglerKind

RATIO: Final = 1.4
WINDOW_S: Final = 20.0
MIN_REPORTS: Final = 5
SHARE: Final = 0.8
"""The share of a slow rank's reports over the window that must be above the bound."""
BASELINE_REPORTS: Final = 10
"""A gang's first reports that set the wait it is judged against (``SLOW_LINK``)."""
MIN_EXTRA_WAIT_MS: Final = 20.0
"""A gang's wait must grow this much too before a link is blamed: a few ms of noise is no slow link."""


Kind = StragglerKind


@dataclass(frozen=True)
class Bounds:
    ratio: float = RATIO
    window_s: float = WINDOW_S
    min_reports: int = MIN_REPORTS
    share: float = SHARE


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
    """How much slower than the rest of the gang (slow node, imbalanced job), or its wait over its baseline (link)."""
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
    history: dict[int, deque[Report]] = field(default_factory=dict)
    """By rank: its reports of the last window (and the one before it, which shows the window is covered)."""
    runs: dict[int | None, _Run] = field(default_factory=dict)
    """By rank (None: the gang's waits, for a slow link)."""
    judged: set[int | None] = field(default_factory=set)
    waits: list[float] = field(default_factory=list)
    """The gang's first waits a step (``BASELINE_REPORTS`` of them): its baseline."""


def _per_sample(report: Report) -> float:
    return report.compute_ms / report.samples_per_step if report.samples_per_step > 0 else 0.0


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
        if first:
            return None  # an attempt's first report covers its start-up too
        kept = gang.history.setdefault(event.shard_index, deque())
        kept.append(report)
        while len(kept) > 1 and (report.at - kept[1].at).total_seconds() >= self.bounds.window_s:
            kept.popleft()
        if len(gang.newest) < 2:
            return None
        found = self._rank(gang, event, report)
        return found if found is not None else self._link(gang, event, report)

    def forget(self, job_id: str) -> None:
        for key in [k for k in self._gangs if k[0] == job_id]:
            del self._gangs[key]

    def _rank(self, gang: _Gang, event: ShardProgress, report: Report) -> Straggler | None:
        rank, bound = event.shard_index, self.bounds.ratio
        kept = gang.history[rank]
        window = [r for r in kept if (report.at - r.at).total_seconds() < self.bounds.window_s]
        covered = (report.at - kept[0].at).total_seconds() >= self.bounds.window_s
        others = [list(gang.history[i]) for i in gang.history if i != rank and gang.history[i]]
        if rank in gang.judged or not covered or len(window) < self.bounds.min_reports or not others:
            return None
        typical = statistics.median(statistics.median(r.compute_ms for r in o) for o in others)
        own = statistics.median(r.compute_ms for r in window)
        above = [r for r in window if r.compute_ms > bound * typical]
        if typical <= 0 or own <= bound * typical or len(above) < self.bounds.share * len(window):
            return None
        gang.judged.add(rank)
        typical_per_sample = statistics.median(statistics.median(_per_sample(r) for r in o) for o in others)
        slow_per_sample = (
            typical_per_sample > 0 and statistics.median(map(_per_sample, window)) > bound * typical_per_sample
        )
        kind = Kind.SLOW_NODE if slow_per_sample else Kind.IMBALANCED_JOB
        since, ratio = above[0].at, own / typical
        what = "its own time" if slow_per_sample else "its own time per step, not per sample (a larger slice)"
        detail = (
            f"rank {rank} on {report.node_id}: {own:.0f} ms a step of {what} (the median of {len(window)} reports), "
            f"{ratio:.2f}x the gang's {typical:.0f} ms, for {(report.at - since).total_seconds():.0f} s"
        )
        return Straggler(event.job_id, event.attempt, kind, rank, report.node_id, None, ratio, since, detail)

    def _link(self, gang: _Gang, event: ShardProgress, report: Report) -> Straggler | None:
        if self._slow_links is None:
            return None
        slowest_own = max(r.compute_ms for r in gang.newest.values())
        wait = max(0.0, report.step_ms - slowest_own)
        if len(gang.waits) < BASELINE_REPORTS:
            gang.waits.append(wait)
            return None
        baseline = statistics.median(gang.waits)
        ratio = wait / baseline if baseline > 0 else 0.0
        grown = wait > self.bounds.ratio * baseline + MIN_EXTRA_WAIT_MS and not self._any_slow_rank(gang)
        if not self._held(gang, None, report.at, grown):
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
            f"the gang waits {wait:.0f} ms a step, {ratio:.2f}x its first {baseline:.0f} ms, with no rank out of line, "
            f"and its link {a} <-> {b} is slow: {what}"
        )
        return Straggler(event.job_id, event.attempt, Kind.SLOW_LINK, None, a, b, ratio, since, detail)

    def _any_slow_rank(self, gang: _Gang) -> bool:
        """Whether some rank's own time over the window (the median of its reports there) is out of line: the gang's
        waits are then that rank's doing. Medians, not the newest reports: on a loaded host a rank's own time of a few
        ms is often off by half in one report, which would keep a slow link from ever being judged."""
        own = [statistics.median(r.compute_ms for r in kept) for kept in gang.history.values() if kept]
        return len(own) > 1 and max(own) > self.bounds.ratio * statistics.median(own)

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
