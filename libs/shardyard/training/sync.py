"""Periodic parameter averaging across shards: flat per-dtype buckets, one AllReduce per bucket.

The first bucket carries one extra element, a control slot in which every rank puts 1 when it was asked to stop
and 0 otherwise. After the (SUM) AllReduce each rank reads the same total there, so all ranks agree, at the same
sync, whether to stop, without an extra collective.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

DEFAULT_BUCKET_BYTES = 8 * 1024 * 1024


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


class _Bucket:
    def __init__(self, params: list[torch.nn.Parameter], *, control: bool = False) -> None:
        first = params[0]
        self.params = params
        self.offsets: list[int] = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        self.flat = torch.zeros(total + (1 if control else 0), dtype=first.dtype, device=first.device)
        self.payload = total
        self.control = total if control else None
        """Index of the control slot (the stop flag), after the parameters; None in every bucket but the first."""

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
        # The control slot (the stop flag) rides in the first bucket.
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

    def allreduce_mean(self, *, stop: bool = False) -> SyncStats:
        """Replace every parameter by its mean over the group and agree on ``stop`` (True if any rank passed True).

        A no-op (bytes 0) with one rank, where the answer is this rank's own ``stop``.
        """
        t0 = time.perf_counter()
        world = self.world_size()
        if world == 1:
            return SyncStats(ms=(time.perf_counter() - t0) * 1000.0, bytes=0, buckets=0, stop=stop)
        if not self._buckets:  # nothing to average: the flag travels alone
            flag = torch.tensor([1.0 if stop else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.SUM, group=self._group)
            return SyncStats(ms=(time.perf_counter() - t0) * 1000.0, bytes=0, buckets=1, stop=bool(flag[0] > 0))
        agreed = stop
        for bucket in self._buckets:
            bucket.pack()
            if bucket.control is not None:
                bucket.flat[bucket.control] = 1.0 if stop else 0.0
            dist.all_reduce(bucket.flat, op=dist.ReduceOp.SUM, group=self._group)
            if bucket.control is not None:
                agreed = bool(bucket.flat[bucket.control] > 0)
            bucket.flat.div_(world)
            bucket.unpack()
        return SyncStats(
            ms=(time.perf_counter() - t0) * 1000.0, bytes=self.total_bytes, buckets=self.num_buckets, stop=agreed
        )
