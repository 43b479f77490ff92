"""The gang's syncs: what is averaged, when, how long a sync may take, and the pace.

- ``sync_interval`` 1, synchronous data parallelism: every step, between the backward pass and the optimizer step,
  the gradients are averaged (:class:`~shardyard.training.sync.GradSync`). Every rank then applies the same update
  to the same parameters: the gang trains as one process would on the union of its ranks' batches (DDP's
  semantics). One AllReduce of the model's size per step.
- ``sync_interval`` N > 1, local SGD: each rank steps on its own batches and every N steps (widened after slow
  syncs, see :mod:`shardyard.training.pacing`) the parameters are averaged
  (:class:`~shardyard.training.sync.ParamSync`). N times less communication; the ranks drift apart in between.

Either sync carries the stop flag and the slow votes, so a preemption stops every rank at the same step and every
rank judges the pace alike. With local SGD a notice need not wait for the next sync: the ranks agree on an earlier
stop point through the gang's store (:mod:`shardyard.training.notice`: every rank closes its interval there before
each parameter sync) and make a stop sync there (:meth:`GangSync.stop_on_notice`). A sync past ``sync_timeout_s`` raises
:class:`~shardyard.training.errors.SyncTimeoutError`.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch.distributed as dist
from torch import nn

from shardyard import tracing
from shardyard.training.config import RunConfig
from shardyard.training.errors import sync_comm
from shardyard.training.notice import NoticeStop
from shardyard.training.pacing import SLOW_STREAK, SyncPacer
from shardyard.training.slowdown import LinkDelay
from shardyard.training.sync import GradSync, ParamSync, SyncStats

_PREFIX = "shardyard.training"


class GangSync:
    def __init__(
        self, cfg: RunConfig, model: nn.Module, group: dist.ProcessGroup, start: int, notice: NoticeStop | None = None
    ) -> None:
        self.cfg = cfg
        self.notice = None if cfg.averages_gradients else notice
        """Where the ranks agree to stop between two parameter syncs (local SGD only: every step syncs otherwise)."""
        self.averages_gradients = cfg.averages_gradients
        params = list(model.parameters())
        self.sync = GradSync(params, group=group) if self.averages_gradients else ParamSync(params, group=group)
        self.pacer = SyncPacer(base_interval=cfg.sync_interval, factor=cfg.slow_sync_factor)
        self.stats = SyncStats(ms=0.0, bytes=0, buckets=0)
        self.count = 0
        self.next_sync = start + self.pacer.interval
        self.link_delay = LinkDelay()

    def gradients(self, step: int, *, stop: bool) -> bool | None:
        """Between the backward pass and the optimizer step of ``step``: with gradient averaging, average the
        gradients and return whether the gang agreed to stop at this step; else None (nothing happened)."""
        if not self.averages_gradients:
            return None
        return self._run(step, stop=stop, what="gradient")

    def parameters(self, step: int, *, stop: bool) -> bool | None:
        """After the optimizer step of ``step``: with local SGD, when a sync is due (and always at the last step),
        average the parameters and return whether the gang agreed to stop here; else None."""
        if self.averages_gradients or (step < self.next_sync and step != self.cfg.max_steps):
            return None
        if self.notice is not None:
            with sync_comm(f"closing the notice interval at step {step}", self.cfg.sync_timeout_s):
                self.notice.closing(step)
        with tracing.span("sync", {"shardyard.step": step, "shardyard.sync": self.count + 1}) as span:
            stopped = self._run(step, stop=stop, what="parameter")
            span.set_attribute("shardyard.allreduce_bytes", self.stats.bytes)
        if self.notice is not None and self.cfg.rank == 0:
            self.notice.forget(step)  # every rank is past the interval's key: the sync needed them all
        self.next_sync = step + self.pacer.interval
        return stopped

    @property
    def sync_step(self) -> int:
        """The step of the next regular sync: where the interval of the steps being trained ends."""
        return min(self.next_sync, self.cfg.max_steps)

    def stop_on_notice(self, step: int, *, noticed: bool) -> bool:
        """After ``step`` (local SGD, between two syncs): True when the gang agreed to stop here on a notice, the
        stop sync made (the parameters averaged, as at a sync). False, at once, without the notice (``noticed``),
        with gradient averaging, or at the last step; else once the ranks agreed to train on."""
        if self.notice is None or not noticed or step >= self.sync_step:
            return False
        with sync_comm(f"agreeing on a stop point after step {step}", self.cfg.sync_timeout_s):
            if not self.notice.at_boundary(step, self.sync_step):
                return False
        with tracing.span("sync", {"shardyard.step": step, "shardyard.sync": self.count + 1, "shardyard.notice": 1}):
            return self._run(step, stop=True, what="notice stop")  # True: this rank carries the flag

    def _run(self, step: int, *, stop: bool, what: str) -> bool:
        last = step == self.cfg.max_steps
        with sync_comm(f"{what} AllReduce at step {step}", self.cfg.sync_timeout_s):
            delayed_s = self.link_delay.wait()  # a test's slow network (off in any real run)
            # At the last step the run is complete: finishing beats checkpointing.
            stats = self.sync.allreduce_mean(stop=stop and not last, slow=self.pacer.vote)
            self.stats = replace(stats, ms=stats.ms + 1000.0 * delayed_s) if delayed_s else stats
        self.count += 1
        previous = self.pacer.interval
        where = f"{_PREFIX}[rank {self.cfg.rank}]"
        if self.pacer.observe(self.stats.ms, agreed_slow=self.stats.slow) is not None:
            print(
                f"{where}: {self.pacer.slow_syncs} slow syncs, the last {self.stats.ms:.1f} ms;"
                f" sync interval {previous} -> {self.pacer.interval} steps from step {step}",
                file=sys.stderr,
            )
        elif self.pacer.streak == SLOW_STREAK:
            print(
                f"{where}: {SLOW_STREAK} slow syncs in a row, the last {self.stats.ms:.1f} ms; the sync interval stays"
                f" at {self.pacer.interval} steps (its maximum)",
                file=sys.stderr,
            )
        return self.stats.stop
