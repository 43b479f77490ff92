"""Averaging across shards through flat per-dtype buckets, one AllReduce per bucket: of the parameters
(:class:`ParamSync`, local SGD: ``sync_interval`` > 1) or of the gradients (:class:`GradSync`, synchronous data
parallelism: ``sync_interval`` 1, every rank then applies the same update, as with DDP).

The first bucket carries two extra elements, control slots: in the first every rank puts 1 when it was asked to
stop and 0 otherwise, in the second 1 when it votes that the previous sync was slow (see
:mod:`shardyard.training.pacing`). After the (SUM) AllReduce each rank reads the same totals there, so all ranks
agree, at the same sync, whether to stop and how many voted "slow", without an extra collective. The totals are
small integers, exact in any float dtype.

Every bucket's AllReduce is issued at once, asynchronously; each bucket is divided by the world size as soon as its
own has completed, while the next ones are still in flight. Besides the transfer, a sync's cost is the passes over
memory (a CPU copies a buffer about as fast as gloo reduces it over loopback), so :class:`ParamSync` makes only the
division: the parameters live in its buckets (it re-points them there when it is built) and are reduced in place.
A sync that fails half-way leaves them undefined; the shard then fails (COMM_ERROR, SYNC_TIMEOUT) and its gang
resumes from its last checkpoint, taken from a copy. :class:`GradSync` copies the gradients in and out (a gradient
sync is a small part of its step).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024
"""DDP's default bucket size. Against 8 MiB it synced 64 MiB of parameters about 4 % faster over gloo on two ranks
sharing two cores (two interleaved runs of 40 syncs)."""
_CONTROL_SLOTS = 2  # stop, slow


@dataclass(frozen=True)
class SyncStats:
    ms: float
    """Wall time of the whole sync (packing, AllReduces, division, unpacking)."""
    bytes: int
    """Payload bytes reduced (sum of bucket sizes, parameters or gradients only); 0 when nothing was reduced."""
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
    """One flat tensor for some parameters of one dtype and device (plus the control slots in the first bucket), with
    a view of it per parameter, shaped like it."""

    def __init__(self, params: list[torch.nn.Parameter], *, control: bool) -> None:
        first = params[0]
        total = sum(p.numel() for p in params)
        self.params = params
        self.flat = torch.zeros(total + (_CONTROL_SLOTS if control else 0), dtype=first.dtype, device=first.device)
        self.payload = self.flat[:total]
        self.slots = self.flat[total:] if control else None
        """The control slots (stop, then slow), after the payload; None in every bucket but the first."""
        self.views: list[torch.Tensor] = []
        offset = 0
        for p in params:
            self.views.append(self.flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

    @property
    def nbytes(self) -> int:
        """Payload bytes (the control slots are not payload)."""
        return self.payload.numel() * self.flat.element_size()


class _BucketedMean:
    """The buckets and their AllReduce; a subclass says what is averaged (:meth:`_pack`, :meth:`_unpack`).

    Parameters are grouped, in the given order, into flat buckets of one dtype and device each, a bucket closing
    when the next parameter would take it past ``bucket_bytes`` (a larger parameter gets its own). Parameters
    passed twice (tied weights) are reduced once.
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
        first = self._buckets[0].flat if self._buckets else torch.zeros(0)
        self._votes = {
            (stop, slow): torch.tensor([float(stop), float(slow)], dtype=first.dtype, device=first.device)
            for stop in (False, True)
            for slow in (False, True)
        }
        """The control slots' contents for each (stop, slow), ready to copy in: one operation, not two."""

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
        """Replace what this sync averages by its mean over the group, agree on ``stop`` (True if any rank passed
        True) and count the ``slow`` votes.

        A no-op (bytes 0) with one rank, where the answers are this rank's own ``stop`` and ``slow``.
        """
        t0 = time.perf_counter()
        world = self.world_size()
        if world == 1:
            return SyncStats(ms=_ms_since(t0), bytes=0, buckets=0, stop=stop, slow_votes=int(slow))
        if not self._buckets:  # nothing to average: the control slots travel alone
            flags = torch.tensor([float(stop), float(slow)], device=_group_device(self._group))
            dist.all_reduce(flags, op=dist.ReduceOp.SUM, group=self._group)
            total_stop, total_slow = flags.tolist()
            return SyncStats(ms=_ms_since(t0), bytes=0, buckets=1, stop=total_stop > 0, slow_votes=round(total_slow))
        agreed, slow_votes = stop, int(slow)
        with torch.no_grad():
            works = []
            for bucket in self._buckets:
                self._pack(bucket)
                if bucket.slots is not None:
                    bucket.slots.copy_(self._votes[stop, slow])
                works.append(dist.all_reduce(bucket.flat, op=dist.ReduceOp.SUM, group=self._group, async_op=True))
            for bucket, work in zip(self._buckets, works, strict=True):
                if work is not None:
                    work.wait()
                if bucket.slots is not None:
                    total_stop, total_slow = bucket.slots.tolist()
                    agreed, slow_votes = total_stop > 0, round(total_slow)
                bucket.payload.div_(world)
                self._unpack(bucket)
        return SyncStats(
            ms=_ms_since(t0), bytes=self.total_bytes, buckets=self.num_buckets, stop=agreed, slow_votes=slow_votes
        )

    def _pack(self, bucket: _Bucket) -> None:
        """Put what ``bucket`` averages into its flat tensor."""
        raise NotImplementedError

    def _unpack(self, bucket: _Bucket) -> None:
        """Make the reduced mean in ``bucket`` what it averages."""
        raise NotImplementedError


class ParamSync(_BucketedMean):
    """Average the parameters across the process group (``world_size`` ranks) in place: local SGD's sync.

    From its construction on, the parameters live in its buckets (``p.data`` is re-pointed at a view of a flat
    tensor; the Parameter objects stay the same, so an optimizer built before or after is unaffected). Build it once
    the model is on its device: moving the model afterwards leaves the buckets behind.
    """

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__(params, bucket_bytes, group)
        with torch.no_grad():
            for bucket in self._buckets:
                torch._foreach_copy_(bucket.views, [p.detach() for p in bucket.params])
                for p, view in zip(bucket.params, bucket.views, strict=True):
                    p.data = view

    def _pack(self, bucket: _Bucket) -> None:
        pass  # the parameters are the bucket

    def _unpack(self, bucket: _Bucket) -> None:
        pass


class GradSync(_BucketedMean):
    """Average the gradients across the process group in place, after the backward pass and before the optimizer
    step: every rank then applies the same update (synchronous data parallelism, as DDP does).

    A parameter without a gradient on a rank (unused in its forward pass) counts as a zero gradient there and gets
    the averaged one, so that every rank's optimizer sees the same gradients.
    """

    def _pack(self, bucket: _Bucket) -> None:
        present = [(view, p.grad) for view, p in zip(bucket.views, bucket.params, strict=True) if p.grad is not None]
        if present:
            torch._foreach_copy_([view for view, _ in present], [grad for _, grad in present])
        for view, p in zip(bucket.views, bucket.params, strict=True):
            if p.grad is None:
                view.zero_()

    def _unpack(self, bucket: _Bucket) -> None:
        present = [(view, p.grad) for view, p in zip(bucket.views, bucket.params, strict=True) if p.grad is not None]
        if present:
            torch._foreach_copy_([grad for _, grad in present], [view for view, _ in present])
        for view, p in zip(bucket.views, bucket.params, strict=True):
            if p.grad is None:
                p.grad = view.clone()


def _group_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where a collective's tensor must live for this group's backend: the current GPU with NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend(group) == dist.Backend.NCCL:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0
