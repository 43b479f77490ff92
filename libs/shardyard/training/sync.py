"""Periodic parameter averaging across shards: flat per-dtype buckets, one AllReduce per bucket.

The first bucket carries two extra elements, control slots: in the first every rank puts 1 when it was asked to
stop and 0 otherwise, in the second 1 when it votes that the previous sync was slow (see
:mod:`shardyard.training.pacing`). After the (SUM) AllReduce each rank reads the same totals there, so all ranks
agree, at the same sync, whether to stop and how many voted "slow", without an extra collective. The totals are
small integers, exact in any float dtype.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

DEFAULT_BUCKET_BYTES = 8 * 1024 * 1024
_CONTROL_SLOTS = 2  # stop, slow


@dataclass(frozen=True)
class SyncStats:
    ms: float
    """Wall time of the whole sync (pack, AllReduces, unpack)."""
    bytes: int
    """Payload bytes reduced (sum of bucket sizes, parameters only); 0 when there was nothing to reduce."""
    buckets: int
    """Number of AllReduce calls issued."""
    stop: bool = False
    """Whether any rank asked to stop at this sync (the same answer on every rank)."""
    slow_votes: int = 0
    """How many ranks voted that the previous sync was slow (the same answer on every rank)."""

    @property
    def slow(self) -> bool:
        return self.slow_votes > 0


class _Bucket:
    def __init__(self, params: list[torch.nn.Parameter], *, control: bool = False) -> None:
        first = params[0]
        self.params = params
        self.offsets: list[int] = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        self.flat = torch.zeros(total + (_CONTROL_SLOTS if control else 0), dtype=first.dtype, device=first.device)
        self.payload = total
        self.control = total if control else None
        """Index of the first control slot (stop, then slow), after the parameters; None in every bucket but the
        first."""

    @property
    def nbytes(self) -> int:
        """Parameter bytes (the control slot is not payload)."""
        return self.payload * self.flat.element_size()

    def pack(self) -> None:
        with torch.no_grad():
            for p, off in zip(self.params, self.offsets, strict=True):
                self.flat[off : off + p.numel()].copy_(p.reshape(-1))

    def unpack(self) -> None:
        with torch.no_grad():
            for p, off in zip(self.params, self.offsets, strict=True):
                p.copy_(self.flat[off : off + p.numel()].view_as(p))


class ParamSync:
    """Average parameters across the process group (``world_size`` ranks) in place.

    Parameters are grouped, in the given order, into flat buckets of one dtype and device each, a bucket
    closing when the next parameter would take it past ``bucket_bytes`` (a larger parameter gets its own).
    Parameters passed twice (tied weights) are reduced once.
    """

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        self._group = group
        groups: list[list[torch.nn.Parameter]] = []
        open_buckets: dict[tuple[torch.dtype, torch.device], tuple[list[torch.nn.Parameter], int]] = {}
        seen: set[int] = set()
        for p in params:
            if id(p) in seen:
                continue
            seen.add(id(p))
            key = (p.dtype, p.device)
            size = p.numel() * p.element_size()
            members, used = open_buckets.get(key, ([], 0))
            if members and used + size > bucket_bytes:
                groups.append(members)
                members, used = [], 0
            members.append(p)
            open_buckets[key] = (members, used + size)
        groups.extend(members for members, _ in open_buckets.values() if members)
        # The control slots (the stop flag, the slow vote) ride in the first bucket.
        self._buckets = [_Bucket(members, control=index == 0) for index, members in enumerate(groups)]

    @property
    def num_buckets(self) -> int:
        return len(self._buckets)

    @property
    def total_bytes(self) -> int:
        return sum(b.nbytes for b in self._buckets)

    @property
    def bucket_sizes(self) -> list[int]:
        return [b.nbytes for b in self._buckets]

    def world_size(self) -> int:
        if not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size(self._group)

    def allreduce_mean(self, *, stop: bool = False, slow: bool = False) -> SyncStats:
        """Replace every parameter by its mean over the group, agree on ``stop`` (True if any rank passed True) and
        count the ``slow`` votes.

        A no-op (bytes 0) with one rank, where the answers are this rank's own ``stop`` and ``slow``.
        """
        t0 = time.perf_counter()
        world = self.world_size()
        votes = (1.0 if stop else 0.0, 1.0 if slow else 0.0)
        if world == 1:
            return SyncStats(ms=_ms_since(t0), bytes=0, buckets=0, stop=stop, slow_votes=int(slow))
        if not self._buckets:  # nothing to average: the control slots travel alone
            flags = torch.tensor(votes)
            dist.all_reduce(flags, op=dist.ReduceOp.SUM, group=self._group)
            return SyncStats(ms=_ms_since(t0), bytes=0, buckets=1, stop=bool(flags[0] > 0), slow_votes=_count(flags[1]))
        agreed, slow_votes = stop, int(slow)
        for bucket in self._buckets:
            bucket.pack()
            if bucket.control is not None:
                bucket.flat[bucket.control : bucket.control + _CONTROL_SLOTS] = torch.tensor(votes)
            dist.all_reduce(bucket.flat, op=dist.ReduceOp.SUM, group=self._group)
            if bucket.control is not None:
                agreed = bool(bucket.flat[bucket.control] > 0)
                slow_votes = _count(bucket.flat[bucket.control + 1])
            bucket.flat.div_(world)
            bucket.unpack()
        return SyncStats(
            ms=_ms_since(t0), bytes=self.total_bytes, buckets=self.num_buckets, stop=agreed, slow_votes=slow_votes
        )


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def _count(total: torch.Tensor) -> int:
    return round(float(total))
