"""Periodic parameter averaging across shards: flat per-dtype buckets, one AllReduce per bucket."""

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
    """Payload bytes reduced (sum of bucket sizes); 0 when there was nothing to reduce."""
    buckets: int
    """Number of AllReduce calls issued."""


class _Bucket:
    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        first = params[0]
        self.params = params
        self.offsets: list[int] = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        self.flat = torch.zeros(total, dtype=first.dtype, device=first.device)

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

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
        self._buckets: list[_Bucket] = []
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
                self._buckets.append(_Bucket(members))
                members, used = [], 0
            members.append(p)
            open_buckets[key] = (members, used + size)
        self._buckets.extend(_Bucket(members) for members, _ in open_buckets.values() if members)

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

    def allreduce_mean(self) -> SyncStats:
        """Replace every parameter by its mean over the group; a no-op (bytes 0) with one rank."""
        t0 = time.perf_counter()
        world = self.world_size()
        if world == 1:
            return SyncStats(ms=(time.perf_counter() - t0) * 1000.0, bytes=0, buckets=0)
        for bucket in self._buckets:
            bucket.pack()
            dist.all_reduce(bucket.flat, op=dist.ReduceOp.SUM, group=self._group)
            bucket.flat.div_(world)
            bucket.unpack()
        return SyncStats(ms=(time.perf_counter() - t0) * 1000.0, bytes=self.total_bytes, buckets=self.num_buckets)
