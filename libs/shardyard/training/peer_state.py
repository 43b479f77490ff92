"""Resuming a re-formed gang from its surviving peers' state instead of the last checkpoint.

After every sync a data-parallel gang holds one state: the parameters are the same on every rank (averaged), and
each rank's optimizer state is its own (with gradient averaging the same on every rank too). A rank keeps that state
in memory, in the checkpoint's layout (:mod:`shardyard.training.checkpoint`), so that a gang that loses members
resumes at its last sync, not at its last checkpoint (written every ``checkpoint_every`` syncs, maybe seldom):

- With local SGD (``sync_interval`` > 1), after each parameter sync every rank serializes the averaged parameters
  and its optimizer state, and hands its optimizer state to the next rank of a ring (``rank + 1 mod world``): every
  rank's state is then held by two ranks, so the loss of any one rank (or of any ranks that are not ring
  neighbours) leaves the whole state with the survivors.
- With gradient averaging (``sync_interval`` 1) every rank steps alike, so its own parameters and optimizer state
  after its last completed step are the gang's; nothing is copied while training.

When a rank fails (a collective error, a sync timeout, SIGTERM from its agent when the gang is re-formed, any error
of the run) it writes that state to ``<SHARDYARD_PEER_STATE_DIR>/rank-<rank>/``, a directory on its node that the
agent gives every shard of the job and removes when the job ends. The lost rank writes nothing: it is gone.

A survivor whose peer vanished without closing its connections (a node powered off or cut off) is blocked in a
collective until its sync timeout, and Python runs no signal handler meanwhile; the agent would kill it after its
grace period, state unwritten. So SIGTERM also wakes a thread (:class:`TermWatch`), which writes the state at once
when the training thread is waiting on the gang: the training thread holds the state's lock at all other times
(:meth:`PeerSnapshots.waiting_on_gang`), so what that thread writes is a state the training thread had completed.

The re-formed gang agrees at its rendezvous (:mod:`shardyard.training.peer_resume`): every process offers the
snapshots on its node (their step, attempt, world size and the ranks whose state they hold) and the checkpoint step
it read. The newest step whose snapshots, all of one attempt, hold every state the new gang needs wins if it is past
the checkpoint: each rank loads its state from its own node when a snapshot there holds it, else receives it from a
peer that has it (point to point, in rank order). Else the gang resumes from the checkpoint, as before. A snapshot is
never deleted by the gang: a re-formed gang that fails again before its first sync finds the same snapshots again.

An elastic gang re-formed at another world size resumes the same way, new rank ``r`` with the optimizer state of old
rank ``r mod old world`` (all alike with gradient averaging). A single shard keeps its state too: it may grow.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from shardyard.training.checkpoint import FORMAT, OPTIMIZER_FILE, STATE_FILE, optimizer_bytes, rank_optimizer_file
from shardyard.training.config import PEER_STATE_DIR_ENV, RunConfig
from shardyard.training.errors import sync_comm
from shardyard.training.model import TinyGPT, pretrained_files, write_dir_atomic
from shardyard.training.peer_resume import SNAPSHOT_PREFIX
from shardyard.training.peer_resume import Offer as Offer  # re-exported: the resume half lived here
from shardyard.training.peer_resume import ResumePlan as ResumePlan
from shardyard.training.peer_resume import agree_on_resume as agree_on_resume
from shardyard.training.peer_resume import choose as choose
from shardyard.training.peer_resume import describe_plan as describe_plan
from shardyard.training.peer_resume import read_offers as read_offers
from shardyard.training.peer_resume import transfer as transfer

__all__ = [
    "PEER_STATE_DIR_ENV",
    "Offer",
    "PeerSnapshots",
    "ResumePlan",
    "TermWatch",
    "agree_on_resume",
    "choose",
    "describe_plan",
    "read_offers",
    "transfer",
]

_PREFIX = "shardyard.training"
STUCK_AFTER_TERM_S = 1.0
"""A rank still in a collective this long after SIGTERM is stuck on a peer that is gone (see ``save_on_term``)."""


def _state_document(cfg: RunConfig, step: int, loss: float | None, ranks: list[int]) -> bytes:
    document = {
        "format": FORMAT,
        "step": step,
        "loss": loss if loss is not None and math.isfinite(loss) else None,
        "world_size": cfg.world_size,
        "seed": cfg.seed,
        "sync_interval": cfg.sync_interval,
        "attempt": cfg.attempt,
        "ranks": sorted(set(ranks)),
    }
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


class PeerSnapshots:
    """This rank's copy of the gang's state at its last sync, and its writing when the rank fails."""

    def __init__(self, cfg: RunConfig, group: dist.ProcessGroup | None, device: torch.device) -> None:
        self.cfg = cfg
        self.group = group
        self.device = device
        self.root = cfg.peer_state_dir  # a single shard's too: an elastic gang of one may grow
        self.files: dict[str, bytes] | None = None
        self.step = 0
        self.loss: float | None = None
        self.lock = threading.Lock()
        """Held by the training thread (:meth:`hold`) except while it waits on the gang: whoever writes the state
        holds it, so the state written is one the training thread completed."""
        self._kept: int | None = None
        """The step of the state last written."""
        self.waiting = False
        """Whether the training thread is in a collective."""
        self.left = threading.Event()
        """Set when the training thread has left the training loop."""

    @property
    def enabled(self) -> bool:
        return self.root is not None

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """The training thread holds the state while it trains (but see :meth:`waiting_on_gang`)."""
        try:
            with self.lock:
                yield
        finally:
            self.left.set()

    @contextlib.contextmanager
    def waiting_on_gang(self) -> Iterator[None]:
        """Around a collective: the state is complete and untouched meanwhile (a gradient AllReduce writes the
        gradients only, a parameter sync the live parameters, not the snapshot), so another thread may write it."""
        self.waiting = True
        self.lock.release()
        try:
            yield
        finally:
            self.lock.acquire()
            self.waiting = False

    def stepped(self, step: int, loss: float | None) -> None:
        """Gradient averaging: ``step`` is complete, and this rank's state is the gang's (serialized on failure)."""
        self.step, self.loss = step, loss

    def synced(self, step: int, loss: float | None, model: TinyGPT, optimizer: torch.optim.Optimizer) -> None:
        """Local SGD, after the parameter sync of ``step``: snapshot the averaged parameters and this rank's
        optimizer state, and hold the previous rank's. When the exchange fails the previous snapshot stays."""
        if self.root is None:
            return
        cfg = self.cfg
        own = optimizer_bytes(optimizer)
        before, previous = (cfg.rank - 1) % cfg.world_size, own  # a gang of one has no ring
        if before != cfg.rank:
            with self.waiting_on_gang(), sync_comm(f"optimizer state ring exchange at step {step}", cfg.sync_timeout_s):
                previous = _ring_exchange(own, cfg.rank, cfg.world_size, self.group, self.device)
        self.files = {
            **pretrained_files(model),
            rank_optimizer_file(cfg.rank): own,
            rank_optimizer_file(before): previous,
            STATE_FILE: _state_document(cfg, step, loss, [cfg.rank, before]),
        }
        self.step, self.loss = step, loss

    def save(self, model: TinyGPT, optimizer: torch.optim.Optimizer) -> Path | None:
        """Write the snapshot to this node (on failure), holding :attr:`lock`; never raises. Returns where, or None
        when there is none. A state already written is not written again."""
        if self.root is None or self.step == 0:
            return None
        target = self.root / f"{SNAPSHOT_PREFIX}{self.cfg.rank}"
        if self._kept == self.step:
            return target
        try:
            files = self.files
            if files is None and self.cfg.averages_gradients:
                files = {
                    **pretrained_files(model),
                    OPTIMIZER_FILE: optimizer_bytes(optimizer),
                    STATE_FILE: _state_document(self.cfg, self.step, self.loss, list(range(self.cfg.world_size))),
                }
            if files is None:
                return None
            write_dir_atomic(target, files)
        except Exception as exc:  # the rank is failing already: its own error is the one to report
            print(f"{_PREFIX}[rank {self.cfg.rank}]: cannot keep the state of step {self.step}: {exc}", file=sys.stderr)
            return None
        self._kept = self.step
        return target

    def save_on_term(self, model: TinyGPT, optimizer: torch.optim.Optimizer, *, exit_code: int) -> None:
        """From :class:`TermWatch`'s thread: write the state as soon as the training thread lets go of it (at once
        when it is stuck in a collective; else when it ends its step, and has then written it itself). A training
        thread still in a collective ``STUCK_AFTER_TERM_S`` later waits on a peer that is gone: the process ends
        with ``exit_code`` then, instead of at its agent's SIGKILL a grace period later."""
        with self.lock:
            step, where = self.step, self.save(model, optimizer)
        if where is not None:
            print(f"{_PREFIX}[rank {self.cfg.rank}]: kept the gang's state of step {step} in {where}", file=sys.stderr)
        if not self.left.wait(STUCK_AFTER_TERM_S) and self.waiting:
            print(
                f"{_PREFIX}[rank {self.cfg.rank}]: still in a collective {STUCK_AFTER_TERM_S:g} s after SIGTERM;"
                " ending now",
                file=sys.stderr,
                flush=True,
            )
            os._exit(exit_code)


class TermWatch:
    """Calls ``on_term`` in a thread of its own when SIGTERM arrives, even while the main thread is blocked in a
    collective, where Python cannot run the signal's handler: the interpreter's C handler writes the signal's number
    to the wake-up socket (:func:`signal.set_wakeup_fd`) this thread reads. The signal's Python handler (the runner's
    flag) still runs when the main thread gets to it. Only from the main thread; a no-op elsewhere."""

    def __init__(self, on_term: Callable[[], None]) -> None:
        self.on_term = on_term
        self._reader: socket.socket | None = None
        self._writer: socket.socket | None = None
        self._previous = -1

    def __enter__(self) -> TermWatch:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._previous = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="shardyard-term-watch", daemon=True).start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._writer is None:
            return
        signal.set_wakeup_fd(self._previous)
        self._writer.close()  # the watching thread reads the end of the stream and returns

    def _watch(self) -> None:
        assert self._reader is not None
        with self._reader:
            while received := self._reader.recv(64):
                if signal.SIGTERM in received:
                    self.on_term()
                    return


def _ring_exchange(
    payload: bytes, rank: int, world_size: int, group: dist.ProcessGroup | None, device: torch.device
) -> bytes:
    """Send ``payload`` to the next rank and return the previous rank's."""
    after, before = (rank + 1) % world_size, (rank - 1) % world_size
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    their_size = torch.empty(1, dtype=torch.int64, device=device)
    _exchange(size, their_size, after, before, group)
    out = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    into = torch.empty(int(their_size.item()), dtype=torch.uint8, device=device)
    _exchange(out, into, after, before, group)
    return bytes(into.cpu().numpy().tobytes())


def _exchange(out: torch.Tensor, into: torch.Tensor, after: int, before: int, group: dist.ProcessGroup | None) -> None:
    ops = [dist.P2POp(dist.isend, out, after, group), dist.P2POp(dist.irecv, into, before, group)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
