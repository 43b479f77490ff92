"""A gang holding GPUs, and its attempt as a timeline of sizes: a rigid gang has one; an elastic one (a job with
``min_shards``/``max_shards``) a new one at each resize. Pure, in simulated microseconds.

The work model: a job's work is ``duration_s x gpus`` GPU-seconds on full-match GPUs, counted here in seconds at
its preferred size (``gpus``). A gang of ``s`` GPUs progresses at ``s / gpus`` times its speed (the lowest match
score among its nodes): linear data-parallel scaling, the same work in GPU-seconds at any size. A resize re-forms
the gang from its members' live state: no work is lost, but the gang makes no progress for the resize time
(``WorkModel.resize_s``) on its new GPUs; GPUs it gives up are free at once.

Each span of the timeline is one size: from its start, a pause (the restart of an attempt after a preemption, for the
first span; the resize, for any later one), then progress at its rate. The parts of the time an attempt held its GPUs
(``lost_work.Spent``) are GPU-weighted over the spans; its periodic checkpoints keep their wall-clock cadence
(``lost_work.Attempt``), through resizes.
"""

from dataclasses import dataclass, field

from shardyard.sim.lost_work import US, Attempt, Spent, Stopping, to_us
from shardyard.sim.trace import TraceJob

Shards = tuple[tuple[str, tuple[int, ...]], ...]
"""(node id, GPU indices) per node of a gang."""


@dataclass(frozen=True)
class Span:
    """One size of an attempt, from ``from_us`` until the next span (or the attempt's end)."""

    from_us: int
    gpus: int
    resumed_us: int
    """When progress at this size starts: after the restart (the first span) or the resize."""
    rate: float
    """Work (seconds at the preferred size on full-match GPUs) per second of progress: speed x gpus / preferred."""
    remaining_s: float
    """Work left at ``resumed_us``."""


NEVER = 1 << 62
"""The end of the last span: later than any simulated instant."""


def gpu_count(shards: Shards) -> int:
    return sum(len(gpus) for _node, gpus in shards)


@dataclass
class Gang:
    """A job holding GPUs."""

    job: TraceJob
    shards: Shards
    started_us: int
    speed: float
    remaining_s: float
    """Work left when its progress at its current size starts (a rigid gang: when it started)."""
    finish_us: int
    attempt: int
    times: Attempt
    """Its restart and periodic checkpoints (``lost_work``)."""
    preempted_by: str | None = None
    """Set once a policy stopped it for that job."""
    stopping: Stopping | None = None
    """Its notice, release and the work it keeps (None: running, or finishing before its release would)."""
    spans: list[Span] = field(default_factory=list)
    version: int = 0
    """Plans of its finish in this attempt so far: a FINISH event of an older one is stale."""

    @classmethod
    def start(
        cls, job: TraceJob, shards: Shards, now: int, speed: float, remaining_s: float, attempt: int, times: Attempt
    ) -> "Gang":
        gpus = gpu_count(shards)
        rate = speed * (gpus / job.gpus)
        finish = times.progress_us + to_us(remaining_s / rate)
        span = Span(now, gpus, times.progress_us, rate, remaining_s)
        return cls(job, shards, now, speed, remaining_s, finish, attempt, times, spans=[span])

    @property
    def gpus(self) -> int:
        """The GPUs it holds now."""
        return self.spans[-1].gpus

    @property
    def resumed_us(self) -> int:
        """When its progress at its current size starts (``remaining_s`` is the work left then)."""
        return self.spans[-1].resumed_us

    @property
    def rate(self) -> float:
        return self.spans[-1].rate

    def resize(self, now: int, shards: Shards, speed: float, pause_us: int) -> bool:
        """Hold ``shards`` from ``now``, after a pause of ``pause_us``: the work done so far is kept and the finish
        planned again. False when it is no new re-formation: a second resize at one instant replaces the first (a
        gang that started at ``now`` and grows at once re-forms once)."""
        last = self.spans[-1]
        done = max(0, now - last.resumed_us) / US * last.rate
        remaining = max(0.0, last.remaining_s - done)
        gpus = gpu_count(shards)
        rate = speed * (gpus / self.job.gpus)
        counted = last.from_us != now or len(self.spans) == 1
        resumed = max(now + pause_us, last.resumed_us)
        if not counted:
            self.spans.pop()
        self.spans.append(Span(now, gpus, resumed, rate, remaining))
        self.shards, self.speed, self.remaining_s = shards, speed, remaining
        self.finish_us = resumed + to_us(remaining / rate)
        self.version += 1
        return counted

    def work_s(self, until_us: int) -> float:
        """Work done in this attempt up to ``until_us``."""
        done = 0.0
        for span, end in self._ends():
            done += max(0, min(until_us, end) - span.resumed_us) / US * span.rate
        return done

    def gpu_us(self, start: int, end: int) -> int:
        """GPU-microseconds held within ``[start, end)``."""
        held = 0
        for span, until in self._ends():
            low, high = max(start, span.from_us), min(end, until)
            held += span.gpus * max(0, high - low)
        return held

    def paused_us(self, start: int, end: int, *, weighted: bool = True) -> int:
        """The time of its resize pauses within ``[start, end)``, GPU-weighted (or not)."""
        paused = 0
        for span, until in self._ends()[1:]:
            low, high = max(start, span.from_us), min(end, until, span.resumed_us)
            paused += (span.gpus if weighted else 1) * max(0, high - low)
        return paused

    def _ends(self) -> list[tuple[Span, int]]:
        spans = self.spans
        return [(span, spans[i + 1].from_us if i + 1 < len(spans) else NEVER) for i, span in enumerate(spans)]

    def finished(self, now: int) -> tuple[Spent, int]:
        """Its attempt's time on its GPUs, GPU-weighted by part, having run to its end at ``now``; and its productive
        run time (unweighted)."""
        progress = self.times.progress_us
        resizing = self.paused_us(progress, now)
        productive = self.gpu_us(progress, now) - resizing
        spent = Spent(productive=productive, restart=self.gpu_us(self.started_us, progress), resizing=resizing)
        return spent, now - progress - self.paused_us(progress, now, weighted=False)

    def preempted(self, stopping: Stopping) -> tuple[Spent, int]:
        """Likewise for an attempt preempted with ``stopping`` (``lost_work.preempted``, over the spans)."""
        progress, notice, kept = self.times.progress_us, stopping.notice_us, stopping.kept_us
        restart = self.gpu_us(self.started_us, min(progress, notice))
        productive = self.gpu_us(progress, kept) - self.paused_us(progress, kept)
        after = max(kept, progress)
        recomputed = self.gpu_us(after, notice) - self.paused_us(after, notice)
        resizing = self.paused_us(progress, max(kept, notice))
        held = self.gpu_us(self.started_us, stopping.release_us)
        stopped = held - restart - productive - recomputed - resizing
        spent = Spent(productive, restart, recomputed, stopped, resizing)
        return spent, max(0, kept - progress) - self.paused_us(progress, kept, weighted=False)
