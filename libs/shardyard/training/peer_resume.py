"""Resuming a re-formed gang from its members' kept state (:mod:`shardyard.training.peer_state` keeps it): the
snapshots a process finds on its node (``read_offers``), the plan every rank of the new gang agrees on
(``choose``, ``agree_on_resume``), and each rank's state read on its node or received from a peer (``transfer``).

The new gang may be of another world size than the one that kept the state (an elastic job resized): new rank ``r``
continues with old rank ``r mod old world``'s optimizer state (every rank's is the same with gradient averaging),
and the parameters, averaged at the last sync, are every rank's.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from shardyard.training.checkpoint import OPTIMIZER_FILE, STATE_FILE, Checkpoint, load_checkpoint, rank_optimizer_file
from shardyard.training.config import RunConfig
from shardyard.training.errors import CommError, comm
from shardyard.training.model import CheckpointError, write_dir_atomic

SNAPSHOT_PREFIX = "rank-"
"""A rank's snapshot directory on its node: ``rank-<rank>``."""


@dataclass(frozen=True)
class Offer:
    """A snapshot on a process's node, as the gang sees it at its rendezvous."""

    step: int
    attempt: int
    ranks: tuple[int, ...]
    """The ranks whose optimizer state it holds (every rank with gradient averaging)."""
    world_size: int
    """The world size of the gang that wrote it (the ranks' numbering)."""
    directory: str


@dataclass(frozen=True)
class ResumePlan:
    step: int
    attempt: int
    world_size: int
    """The world size of the gang whose state it is (which may differ from the re-formed gang's)."""
    sources: dict[int, tuple[int, str]]
    """For each rank, the rank that holds its state and the snapshot directory on that rank's node."""

    def old_rank(self, rank: int) -> int:
        """The rank of the gang that wrote the state whose optimizer state ``rank`` continues with."""
        return rank % self.world_size


def read_offers(root: Path | None, cfg: RunConfig) -> list[Offer]:
    """The snapshots under ``root`` that this gang can resume from: same sync interval and seed (any world size: an
    elastic gang is re-formed at another), a step within ``max_steps``; unreadable ones are left out."""
    if root is None or not root.is_dir():
        return []
    offers = []
    for directory in sorted(root.glob(f"{SNAPSHOT_PREFIX}*")):
        try:
            raw = json.loads((directory / STATE_FILE).read_text())
            fits = (raw["sync_interval"], raw["seed"]) == (cfg.sync_interval, cfg.seed)
            step, attempt, ranks = int(raw["step"]), int(raw["attempt"]), tuple(int(r) for r in raw["ranks"])
            world = int(raw["world_size"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if fits and 0 < step <= cfg.max_steps and all(0 <= r < world for r in ranks):
            offers.append(Offer(step=step, attempt=attempt, ranks=ranks, world_size=world, directory=str(directory)))
    return offers


def choose(checkpoint_step: int, offers: list[list[Offer]], world_size: int) -> ResumePlan | None:
    """The peers' state to resume from, given each rank's ``offers``: the newest (step, attempt) whose snapshots
    hold the state of every rank of the new gang of ``world_size`` (rank ``r``: the state of rank ``r mod W`` of the
    gang of ``W`` that wrote them), if it is past ``checkpoint_step``; None to resume from the checkpoint. A rank takes
    its state from its own node where it can, else from the lowest rank that has it."""
    holders: dict[tuple[int, int, int], dict[int, list[tuple[int, str]]]] = {}
    for rank, mine in enumerate(offers):
        for offer in mine:
            held = holders.setdefault((offer.step, offer.attempt, offer.world_size), {})
            for covered in offer.ranks:
                held.setdefault(covered, []).append((rank, offer.directory))
    for (step, attempt, was), held in sorted(holders.items(), reverse=True):
        if step <= checkpoint_step:
            return None
        if all(rank % was in held for rank in range(world_size)):
            sources = {}
            for rank in range(world_size):
                local = [h for h in held[rank % was] if h[0] == rank]
                sources[rank] = (local or sorted(held[rank % was]))[0]
            return ResumePlan(step=step, attempt=attempt, world_size=was, sources=sources)
    return None


def agree_on_resume(cfg: RunConfig, checkpoint_step: int, offers: list[Offer]) -> ResumePlan | None:
    """Every rank learns the others' offers and checkpoint step and reaches the same plan. Without one, every rank
    must have resumed from the same checkpoint step: a rank that read the checkpoint while the rank 0 of the broken
    gang was still putting a later one in place can differ, and the gang then fails (and is retried) instead of
    diverging. A gang of one has nobody to hear from: its own node's snapshots decide."""
    if cfg.world_size == 1:
        return choose(checkpoint_step, [offers], 1)
    gathered: list[Any] = [None] * cfg.world_size
    with comm("resume agreement all_gather"):
        dist.all_gather_object(gathered, (checkpoint_step, [asdict(o) for o in offers]))
    starts = [int(g[0]) for g in gathered]
    everyone = [[Offer(**{**o, "ranks": tuple(o["ranks"])}) for o in g[1]] for g in gathered]
    plan = choose(max(starts), everyone, cfg.world_size)
    if plan is None and len(set(starts)) > 1:
        raise CommError(f"the ranks resumed from different steps {starts}: the checkpoint changed while they read it")
    return plan


def _files_for(directory: Path, old_rank: int, rank: int) -> dict[str, bytes]:
    """The files a rank resumes from: the model, the state, and the optimizer state of ``old_rank`` (of the gang that
    wrote the snapshot) under the checkpoint's name for ``rank`` (``load_checkpoint(rank=rank)`` reads it)."""
    own = directory / rank_optimizer_file(old_rank)
    optimizer = own if own.is_file() else directory / OPTIMIZER_FILE  # gradient averaging: one state for all
    names = [p.name for p in directory.iterdir() if p.is_file() and p.name.endswith((".json", ".safetensors"))]
    files = {n: (directory / n).read_bytes() for n in names if not n.startswith("optimizer")}
    files[rank_optimizer_file(rank)] = optimizer.read_bytes()
    return files


def transfer(cfg: RunConfig, plan: ResumePlan) -> Checkpoint:
    """This rank's state under ``plan``: read on its node, or received from the rank that holds it. Every rank runs
    the transfers in rank order, so each pair meets in the same one."""
    mine: Checkpoint | None = None
    for rank in range(cfg.world_size):
        holder, directory = plan.sources[rank]
        if holder == rank == cfg.rank:
            mine = _load(Path(directory), plan.old_rank(rank))  # the snapshot's own numbering
        elif holder == cfg.rank:
            with comm(f"rank {rank}'s state to it"):
                dist.send_object_list([_files_for(Path(directory), plan.old_rank(rank), rank)], dst=rank)
        elif rank == cfg.rank:
            received: list[Any] = [None]
            with comm(f"this rank's state from rank {holder}"):
                dist.recv_object_list(received, src=holder)
            with tempfile.TemporaryDirectory(prefix="shardyard-peer-state-") as scratch:
                target = Path(scratch) / "state"
                write_dir_atomic(target, received[0])
                mine = _load(target, rank)
    assert mine is not None  # the plan names a source for every rank
    return mine


def _load(directory: Path, rank: int) -> Checkpoint:
    try:
        return load_checkpoint(directory, rank=rank)
    except CheckpointError as exc:
        raise CommError(f"the peers' state for rank {rank} cannot be read: {exc}") from exc


def describe_plan(plan: ResumePlan, rank: int, world_size: int) -> str:
    holder, _ = plan.sources[rank]
    where = "this node" if holder == rank else f"rank {holder}"
    resized = "" if plan.world_size == world_size else f" of a gang of {plan.world_size}, rank {plan.old_rank(rank)}'s"
    return f"its peers' state of step {plan.step} (attempt {plan.attempt}; this rank's from {where}{resized})"
