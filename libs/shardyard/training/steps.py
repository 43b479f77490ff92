"""The named steps of one shard's training run (:func:`shardyard.training.runner.train` reads as their sequence):
joining the gang (inputs, device, rendezvous, resuming from a checkpoint or the survivors' state), one training
step, keeping the gang's state when a step fails, and ending (the final model, or the checkpoint of a stop).

A step is the gang's batch (``SHARDYARD_GLOBAL_BATCH``, else world size x batch size), each rank training on its
slice (:mod:`shardyard.training.data`). An elastic gang re-formed at another world size keeps the global batch, the
learning rate and the data order: with gradient averaging each rank's loss is weighted by its slice's share
(:attr:`RunConfig.loss_weight`), so the update is the one of the mean loss over the whole batch, as at any other
size; with local SGD each rank's local steps use its slice. Progress counts this rank's samples."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from shardyard import tracing
from shardyard.training.checkpoint import Checkpoint, load_checkpoint
from shardyard.training.config import RunConfig
from shardyard.training.data import ByteDataset, DatasetError
from shardyard.training.errors import UserError, comm
from shardyard.training.gang_checkpoints import GangCheckpoints
from shardyard.training.gang_sync import GangSync
from shardyard.training.model import CheckpointError, TinyGPT, load_pretrained, save_pretrained
from shardyard.training.peer_resume import agree_on_resume, describe_plan, read_offers, transfer
from shardyard.training.peer_state import PeerSnapshots, TermWatch
from shardyard.training.preemption import CHECKPOINT_SUBDIR, StopFlag
from shardyard.training.progress import ProgressReporter, StepLog
from shardyard.training.rendezvous import Placement, init_process_group, place
from shardyard.training.slowdown import Slowdown

PREFIX = "shardyard.training"


@dataclass(frozen=True)
class Outcome:
    steps: int
    """The last step completed: ``max_steps``, or the step the gang stopped at."""
    loss: float
    preempted: bool


@dataclass
class Joined:
    """This rank, in its gang: the model on its device, the process group, and where training goes on from."""

    model: TinyGPT
    dataset: ByteDataset
    placement: Placement
    group: dist.ProcessGroup
    resumed: Checkpoint | None
    start: int
    store: dist.Store
    """The gang's store (the rendezvous'): where the ranks agree to stop on a notice."""


def load_inputs(cfg: RunConfig) -> tuple[TinyGPT, ByteDataset, Checkpoint | None]:
    """The model (from the resume checkpoint when there is one, else the pretrained one) and the dataset."""
    try:
        resumed = None if cfg.resume_dir is None else load_checkpoint(cfg.resume_dir, rank=cfg.rank)
        model = load_pretrained(cfg.model_dir) if resumed is None else resumed.model
        dataset = ByteDataset.from_dir(cfg.dataset_dir)
        dataset.check_seq_len(cfg.seq_len)
    except (CheckpointError, DatasetError) as exc:
        raise UserError(str(exc)) from exc
    if cfg.seq_len > model.config.n_positions:
        raise UserError(f"SHARDYARD_SEQ_LEN={cfg.seq_len} exceeds the model's n_positions={model.config.n_positions}")
    if model.config.vocab_size < 256:
        raise UserError(f"the model's vocab_size={model.config.vocab_size} is below 256, the byte ids of the dataset")
    if resumed is not None and resumed.state.step > cfg.max_steps:
        raise UserError(
            f"checkpoint {cfg.resume_dir} is at step {resumed.state.step}, past SHARDYARD_MAX_STEPS={cfg.max_steps}"
        )
    return model, dataset, resumed


def join_gang(cfg: RunConfig, where: str) -> Joined:
    """Load the inputs and choose the device (before the rendezvous: bad input or a missing GPU fails fast, not after
    a timeout), meet the gang, and agree where to resume: the checkpoint, or the survivors of a broken gang when
    they hold a later state."""
    model, dataset, resumed = load_inputs(cfg)
    placement = place(cfg)
    model.to(placement.device)
    start = 0 if resumed is None else resumed.state.step
    rendezvous: tracing.Attributes = {
        "shardyard.master": f"{cfg.master_addr}:{cfg.master_port}",
        "shardyard.backend": placement.backend,
    }
    with tracing.span("rendezvous", rendezvous) as span:
        group, store = init_process_group(cfg, placement)
        plan = agree_on_resume(cfg, start, read_offers(cfg.peer_state_dir, cfg))
        if plan is not None:
            resumed = transfer(cfg, plan)
            model = resumed.model.to(placement.device)
            start = plan.step
            span.set_attribute("shardyard.resumed_from_peers", start)
    if plan is not None:
        print(
            f"{PREFIX}[rank {cfg.rank}]: resuming from {describe_plan(plan, cfg.rank, cfg.world_size)}", file=sys.stderr
        )
    elif resumed is not None:
        print(f"{PREFIX}[rank {cfg.rank}]: resuming from {cfg.resume_dir} at step {start}", file=sys.stderr)
    mode = "gradients every step" if cfg.averages_gradients else f"parameters every {cfg.sync_interval} steps"
    print(f"{where}: training on {placement.device} over {placement.backend}, averaging {mode}", file=sys.stderr)
    return Joined(model, dataset, placement, group, resumed, start, store)


def restore_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any], lr: float) -> None:
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise UserError(f"the checkpoint's optimizer state does not fit the model: {exc}") from exc
    for group in optimizer.param_groups:
        group["lr"] = lr  # the run's configuration wins over the saved hyper-parameters


class Rate:
    """The training rate from the end of the first step to the end of the last (what ``bench/training.py`` reads)."""

    def __init__(self) -> None:
        self.first: tuple[int, float] | None = None
        self.last: tuple[int, float] | None = None

    def stepped(self, step: int) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = (step, now)
        self.last = (step, now)

    def report(self, where: str) -> None:
        if self.first is None or self.last is None or self.last[0] == self.first[0]:
            return
        steps, seconds = self.last[0] - self.first[0], self.last[1] - self.first[1]
        print(
            f"{where}: trained steps {self.first[0]}..{self.last[0]}, {steps} steps in {seconds:.3f} s after the"
            f" first: {steps / seconds:.2f} steps/s",
            file=sys.stderr,
        )


class Steps:
    """The training loop's state between steps: the optimizer, the batches, the syncs, the checkpoints and the
    survivors' snapshots; :meth:`step` is one step."""

    def __init__(
        self, cfg: RunConfig, gang: Joined, syncs: GangSync, reporter: ProgressReporter, *, terminated_exit: int
    ) -> None:
        self.cfg, self.syncs, self.reporter = cfg, syncs, reporter
        self.model, self.device, self.start = gang.model, gang.placement.device, gang.start
        gang.model.train()
        self.optimizer = torch.optim.AdamW(gang.model.parameters(), lr=cfg.lr)
        resumed = gang.resumed
        if resumed is not None and resumed.optimizer is not None:
            restore_optimizer(self.optimizer, resumed.optimizer, cfg.lr)
        self.stream = gang.dataset.batches(
            cfg.rank,
            cfg.world_size,
            cfg.batch_size,
            cfg.seq_len,
            cfg.seed,
            start_step=gang.start,
            global_batch=cfg.global_batch,
        )
        lo, hi = cfg.batch_slice
        self.samples = hi - lo
        """This rank's samples a step: its slice of the gang's batch."""
        self.loss = float("nan") if resumed is None or resumed.state.loss is None else resumed.state.loss
        self.last, self.stopped = gang.start, False
        self.reported = gang.start
        """The last step told to the agent."""
        self.noticed_after: int | None = None
        """The step after which this rank first saw the notice (logged: what a preemption lost is measured from)."""
        self.rate = Rate()
        self.compute_s, self._waited_s = 0.0, 0.0
        self.slowdown = Slowdown()
        """This rank's own time in its steps so far, without its waits on the gang (a straggler's is the longest)."""
        self.log = StepLog(f"{PREFIX}[rank {cfg.rank}/{cfg.world_size}]", cfg.max_steps, cfg.step_log_every_s)
        self.checkpoints = GangCheckpoints(cfg, reporter)
        self.peers = PeerSnapshots(cfg, gang.group, self.device)
        on_term = partial(self.peers.save_on_term, self.model, self.optimizer, exit_code=terminated_exit)
        self.keeper: contextlib.AbstractContextManager[object] = (
            TermWatch(on_term) if self.peers.enabled else contextlib.nullcontext()
        )

    def step(self, step: int, stop: StopFlag) -> bool:
        """Train step ``step``: forward, backward, the gradient or parameter sync, a checkpoint when one is due, the
        progress line. True when the gang stops here (a stop request met at a sync; rank 0 has checkpointed). A disk
        that filled under the last checkpoint fails the step first (``GangCheckpoints.check``)."""
        self.checkpoints.check()
        self.last = step
        began, self._waited_s = time.perf_counter(), 0.0
        inputs, targets = (t.to(self.device, non_blocking=True) for t in next(self.stream))
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        self.optimizer.zero_grad(set_to_none=True)
        weight = self.cfg.loss_weight  # uneven slices: the averaged gradient is still the whole batch's mean loss's
        torch.autograd.backward(loss if weight == 1.0 else loss * weight)
        self.slowdown.stretch(time.perf_counter() - began)  # a test's slow GPU (off in any real run)
        with self._on_gang():  # sync_interval 1: every rank, the same update
            synced = self.syncs.gradients(step, stop=stop.requested)
        self.optimizer.step()
        self.loss = float(loss.item())
        if synced is None:
            with self._on_gang():  # local SGD: every sync_interval steps
                synced = self.syncs.parameters(step, stop=stop.requested)
            if synced is False and step < self.cfg.max_steps:
                self.peers.synced(step, self.loss, self.model, self.optimizer)
        else:
            self.peers.stepped(step, self.loss)
        self.stopped = bool(synced)
        checkpointed = synced is not None and not self.stopped and step < self.cfg.max_steps
        checkpointed = checkpointed and self.checkpoints.due(step, self.syncs.count)
        if checkpointed:
            self.checkpoints.submit(step, self.loss, self.model, self.optimizer)  # the weights just averaged
        parameters_synced = synced is not None and not self.syncs.averages_gradients
        self.compute_s += time.perf_counter() - began - self._waited_s
        self._report(step, force=checkpointed or parameters_synced, synced=parameters_synced)
        self.rate.stepped(step)
        if self.stopped:
            self.checkpoints.write_now(step, self.loss, self.model, self.optimizer)
        return self.stopped

    @contextlib.contextmanager
    def _on_gang(self) -> Iterator[None]:
        """Around a collective: the peers' snapshot may be written meanwhile, and the wait is not this rank's own
        compute (``compute_s``)."""
        began = time.perf_counter()
        try:
            with self.peers.waiting_on_gang():
                yield
        finally:
            self._waited_s += time.perf_counter() - began

    def stop_on_notice(self, step: int, stop: StopFlag) -> bool:
        """After ``step``, with local SGD: True when the gang stops here on a notice, between two syncs
        (:mod:`shardyard.training.notice`), its parameters averaged and rank 0's checkpoint written. Without a
        notice it costs nothing."""
        if stop.requested and self.noticed_after is None:
            self.noticed_after = step
            print(f"{self.log.where}: notice after step {step}", file=sys.stderr)
        with self.peers.waiting_on_gang():
            self.stopped = self.syncs.stop_on_notice(step, noticed=stop.requested)
        if self.stopped:
            self._report(step, force=True, synced=True)
            self.checkpoints.write_now(step, self.loss, self.model, self.optimizer)
        return self.stopped

    def _report(self, step: int, *, force: bool, synced: bool, ago_s: float = 0.0) -> None:
        """The agent's progress line (``force``: even within a second of the last; the attempt's first step always,
        so that a re-formed gang is seen training at once), and the log's."""
        syncs = self.syncs
        force = force or step == self.start + 1
        reported = self.reporter.progress(
            step=step,
            loss=self.loss,
            samples=(step - self.start) * self.samples,
            allreduce_ms=syncs.stats.ms,
            allreduce_bytes=syncs.stats.bytes,
            syncs=syncs.count,
            sync_interval=syncs.pacer.interval,
            slow_syncs=syncs.pacer.slow_syncs,
            compute_s=self.compute_s,
            force=force,
            ago_s=ago_s,
        )
        if reported:
            self.reported = step
        if not ago_s:
            self.log.step(step, self.loss, syncs.count, synced=synced)

    def report_last(self) -> None:
        """A step failed, or the shard was stopped: tell the agent the last step this rank took, dated when it
        ended, unless it was told already. Lines come at most once a second, and the goodput ledger counts a faulted
        attempt's training until its last step told, and the next attempt's steps as recomputed until they pass the
        highest step told before: without this line both would be short by up to a second of steps."""
        if self.rate.last is None or self.rate.last[0] <= self.reported:
            return
        step, ended = self.rate.last
        self._report(step, force=True, synced=False, ago_s=max(1e-6, time.perf_counter() - ended))

    def keep_state(self, where: str) -> None:
        """A step failed: write the gang's state of the last sync on this node, for a re-formed gang to resume from."""
        if self.peers.enabled and (where_kept := self.peers.save(self.model, self.optimizer)) is not None:
            print(f"{where}: kept the gang's state of step {self.peers.step} in {where_kept}", file=sys.stderr)


def finish(cfg: RunConfig, steps: Steps, reporter: ProgressReporter) -> Outcome:
    """After the last step: a stopped gang waits until the checkpoint is complete, then reports ``preempted``; a
    finished one saves the final model on rank 0, then every rank reports ``finished``."""
    if steps.stopped:
        with comm("checkpoint barrier"):  # nobody reports before the checkpoint is complete
            dist.barrier()
        dist.destroy_process_group()
        reporter.preempted(step=steps.last, checkpoint_dir=steps.checkpoints.directory if cfg.rank == 0 else None)
        return Outcome(steps=steps.last, loss=steps.loss, preempted=True)

    if cfg.rank == 0:
        save_final(steps.model, cfg.output_dir)
    with comm("final barrier"):
        dist.barrier()
    dist.destroy_process_group()
    checkpoint_dir = cfg.output_dir if cfg.rank == 0 else None
    reporter.finished(final_loss=steps.loss, steps=cfg.max_steps, checkpoint_dir=checkpoint_dir)
    return Outcome(steps=cfg.max_steps, loss=steps.loss, preempted=False)


def save_final(model: TinyGPT, output_dir: Path) -> None:
    """The final model replaces the output directory, and the last checkpoint is carried into the new one. A gang can
    be re-formed after this shard finished (its agent was paused or cut off before the end reached the bus, and the
    node was suspected): the new attempt then resumes from that checkpoint instead of failing on a missing one. It
    is carried inside the one atomic swap, so it is there at every instant, also to an attempt starting meanwhile."""
    save_pretrained(model, output_dir, keep=(CHECKPOINT_SUBDIR,))
