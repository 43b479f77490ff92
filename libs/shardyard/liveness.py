"""Liveness judged honestly on a loaded host: how much later than usual a node's silence is suspected, from the
stalls its agent measured in itself.

An agent shares its host with its shards. When the host is saturated (a CPU hog, a compile, a checkpoint being
written), the agent is scheduled late: a beat due every second goes out two seconds late, and to the resource pool
that looks like the start of a node's death. A dead agent tells nothing; a starved one, once it runs, can. So the
agent measures its own stalls, the lag of its event loop (:class:`LoopLag`) and the broker's wait to acknowledge its
beat, and keeps the worst of the last minute (:class:`Stalls`). From it, :func:`margin_s` gives a margin that every
beat carries: the pool suspects the node that much later, and the agent's shards fence themselves that much later
(their lease file says so, ``shardyard.training.lease``), so that the two stay in step, as before, the shards first.

- On an idle host the stalls stay below :data:`STALL_FLOOR_S` and the margin is 0: SUSPECT within 3 s, as ever.
- The margin is at most :data:`MAX_MARGIN_S`: a node really stopped on a loaded host is SUSPECT within 3 + 4 s, and
  LOST within the unchanged 10 s.
- A first stall longer than the suspicion window, on a host that showed none in the minute before, is still
  suspected: nothing can tell it from a death until the agent speaks again.
- The pool's own stalls are its own to allow for (``PoolBook.pause_after_s``): a replica that was not running
  suspects nobody for it.
"""

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Final

from shardyard import metrics

STALL_FLOOR_S: Final = 0.2
"""Stalls shorter than this are an idle host's noise: they widen nothing."""
MARGIN_PER_STALL: Final = 2.0
"""The margin is this many times the worst recent stall: a host that stalled once for a second may stall for two."""
MAX_MARGIN_S: Final = 4.0
"""The most a margin widens suspicion (3 s → 7 s): below the 10 s LOST bound, which it never moves."""
WINDOW_S: Final = 60.0
"""How long a stall is remembered."""
SAMPLE_EVERY_S: Final = 0.1


def margin_s(worst_stall_s: float) -> float:
    """The margin a node's suspicion and its shards' lease are widened by, given its worst recent stall."""
    if worst_stall_s < STALL_FLOOR_S:
        return 0.0
    return round(min(MARGIN_PER_STALL * worst_stall_s, MAX_MARGIN_S), 3)


@dataclass
class Stalls:
    """The worst stall of the last :data:`WINDOW_S`, kept as a sliding maximum. Pure: time (monotonic seconds)
    comes in."""

    window_s: float = WINDOW_S
    _kept: deque[tuple[float, float]] = field(default_factory=deque)
    """(when, how long): each stall longer than every one after it, oldest first."""

    def add(self, at: float, stall_s: float) -> None:
        while self._kept and self._kept[-1][1] <= stall_s:
            self._kept.pop()
        self._kept.append((at, stall_s))

    def worst(self, now: float) -> float:
        while self._kept and self._kept[0][0] < now - self.window_s:
            self._kept.popleft()
        return self._kept[0][1] if self._kept else 0.0


class LoopLag:
    """The lag of the running event loop: a task asks to wake every :data:`SAMPLE_EVERY_S` and measures how late it
    woke. ``take`` gives the worst lag since the last ``take``; every sample goes to
    ``shardyard_agent_loop_lag_seconds``."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S) -> None:
        self.every_s = every_s
        self._worst = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def take(self) -> float:
        worst, self._worst = self._worst, 0.0
        return worst

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            await asyncio.sleep(self.every_s)
            lag = max(0.0, loop.time() - asked - self.every_s)
            self._worst = max(self._worst, lag)
            metrics.AGENT_LOOP_LAG.observe(lag)
