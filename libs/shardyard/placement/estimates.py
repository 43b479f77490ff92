"""Expected run times for jobs that declare none, learned from the jobs that ended. Pure: run times come in.

A job is known by ``(owner, GPU model, GPU count)``, where the owner is its user (or its queue, for a trace or a
submission that names no user). The estimate for a job is a high quantile (``quantile``, 0.9 by default) of the
last ``window`` run times of the first of these that has at least ``min_samples`` of them:

1. the same owner, GPU model and count;
2. the same GPU model and count, any owner;
3. the same count, any model or owner.

Nothing learned yet: no estimate (None), and the job backfills nowhere reserved. A key naming a team (its queue)
is tried first with the team too: a team's jobs of one kind run alike.

Start estimates need the spread, not one figure (:meth:`DurationEstimates.spread`): the run time's quantiles at
:data:`LEVELS` (``shardyard.placement.intervals`` samples from them). A job that declares its run time has that
declaration as a prior: its spread is the declaration times the ratios (actual / declared) its key's declared jobs
ran, once ``min_samples`` of them ended; before then, times :data:`PRIOR_RATIOS` (declarations are a user's guess).
A job that declares nothing has its key's run times' own quantiles.

Safe when wrong:
- the quantile is high, so most jobs end before their estimate;
- a gang still running past its expected end is expected to run on as long again as it has run
  (:func:`~shardyard.placement.worth.overrun_end`): run times are heavy-tailed, so one that outran a high quantile
  is likely to run long yet. (Counting it as ending any moment, the first design, let nothing backfill onto its
  nodes for as long as it overran, days for the longest; in the simulator, the heterogeneous trace at load 0.9
  gained 1.16x over priority-only that way, and 1.74x this way.) This follows Tsafrir, Etsion and
  Feitelson, "Backfilling Using System-Generated Predictions Rather than User Runtime Estimates" (TPDS 2007),
  who extend an exceeded prediction rather than trust it;
- a backfilled job that overruns delays a reservation by its overrun only: the reserved job keeps its place at
  the head of the queue, and the next cycle plans again from what is running.
"""

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from shardyard.events import JobSpec

DEFAULT_QUANTILE = 0.9
DEFAULT_WINDOW = 200
DEFAULT_MIN_SAMPLES = 5
QUANTILES = 20
LEVELS = tuple((i + 0.5) / QUANTILES for i in range(QUANTILES))
"""The levels a spread gives its run times at: the midpoints of 20 equal slices of probability."""
PRIOR_RATIOS = tuple(
    math.exp(0.2 * z) for z in (-1.645, -1.036, -0.674, -0.385, -0.126, 0.126, 0.385, 0.674, 1.036, 1.645)
)
"""Actual / declared run time before any declared job of a key ended: a log-normal of sigma 0.2 around the
declaration (its median), at ten evenly spaced levels; its p90 is 1.29x the declaration."""


@dataclass(frozen=True)
class EstimateKey:
    owner: str
    gpu_model: str | None
    gpus: int
    team: str = ""
    """The queue the job was submitted to ("": not known)."""

    @classmethod
    def of(cls, spec: JobSpec) -> "EstimateKey":
        """A submitted job's key: its team (queue), task type (the nearest thing to "the same user's jobs of this
        kind": submissions name no user), GPU model and size."""
        return cls(spec.task_type, spec.gpu_model, spec.gpu_count, spec.queue)

    def coarser(self) -> tuple[Hashable, ...]:
        """The keys to try, finest first."""
        owner = ("owner", self.owner, self.gpu_model, self.gpus)
        return (
            *((("team", self.team, *owner[1:]),) if self.team else ()),
            owner,
            ("model", self.gpu_model, self.gpus),
            ("gpus", self.gpus),
        )


@dataclass
class DurationEstimates:
    quantile: float = DEFAULT_QUANTILE
    window: int = DEFAULT_WINDOW
    min_samples: int = DEFAULT_MIN_SAMPLES
    _runs: dict[Hashable, deque[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.quantile <= 1:
            raise ValueError(f"the estimate's quantile must be in (0, 1], not {self.quantile}")
        if self.window < 1 or self.min_samples < 1:
            raise ValueError("the window and the minimum sample count must be at least 1")

    def observe(self, key: EstimateKey, run_s: float, declared_s: float | None = None) -> None:
        """A job of ``key`` ended after running ``run_s`` seconds (all its attempts), having declared
        ``declared_s`` (None: nothing): a declared job teaches its key's ratios, the others its run times."""
        if not (math.isfinite(run_s) and run_s >= 0):
            return  # a clock that went backwards teaches nothing
        for level in key.coarser():
            if declared_s is not None and declared_s > 0:
                self._append(("declared", level), run_s / declared_s)
            else:
                self._append(level, run_s)

    def _append(self, level: Hashable, value: float) -> None:
        runs = self._runs.get(level)
        if runs is None:
            runs = self._runs[level] = deque(maxlen=self.window)
        runs.append(value)

    def _known(self, levels: tuple[Hashable, ...]) -> list[float] | None:
        """The samples of the first of ``levels`` with enough of them, ascending; None: none has."""
        for level in levels:
            runs = self._runs.get(level)
            if runs is not None and len(runs) >= self.min_samples:
                return sorted(runs)
        return None

    def estimate(self, key: EstimateKey) -> float | None:
        """The expected run time of a new job of ``key``; None while too little is known."""
        runs = self._known(key.coarser())
        return None if runs is None else nearest_rank(runs, self.quantile)

    def spread(self, key: EstimateKey, declared_s: float | None = None) -> tuple[float, ...]:
        """The run time of a new job of ``key`` at each of :data:`LEVELS` (see the module's doc); empty while
        nothing is known (no declaration, too few runs)."""
        if declared_s is not None:
            ratios = self._known(tuple(("declared", level) for level in key.coarser()))
            return tuple(declared_s * r for r in quantiles(ratios if ratios is not None else list(PRIOR_RATIOS)))
        runs = self._known(key.coarser())
        return () if runs is None else quantiles(runs)


def nearest_rank(ordered: list[float], quantile: float) -> float:
    """The smallest value with at least ``quantile`` of ``ordered`` (ascending, not empty) at or below it."""
    return ordered[max(0, math.ceil(quantile * len(ordered)) - 1)]


def quantiles(ordered: list[float]) -> tuple[float, ...]:
    """``ordered`` (ascending, not empty) at each of :data:`LEVELS`, interpolated between its samples' midpoints."""
    n = len(ordered)
    out = []
    for level in LEVELS:
        x = level * n - 0.5
        low = min(max(math.floor(x), 0), n - 1)
        high = min(low + 1, n - 1)
        weight = min(max(x - low, 0.0), 1.0)
        out.append(ordered[low] * (1 - weight) + ordered[high] * weight)
    return tuple(out)
