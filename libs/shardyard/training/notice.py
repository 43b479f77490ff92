"""Checkpoint on notice: where a local-SGD gang stops between two parameter syncs. Torch-free: the store comes in.

A preemption notice reaches every rank of the built-in runner (:data:`~shardyard.training.preemption.STOP_SIGNAL`),
each at a step of its own: between two syncs the ranks of a local-SGD gang run apart. Waiting for the next sync
could take up to ``sync_interval`` steps, past the notice's deadline, so the ranks agree on an earlier stop point
through the gang's store (the rendezvous' TCPStore), without a collective, and stop there together: a parameter sync
that carries the stop flag, then rank 0's checkpoint (:mod:`shardyard.training.steps`).

The interval that ends at the regular sync of step ``q`` has one key, ``<prefix>/<q>``. Its value is

- absent: nobody proposed a stop point in it yet;
- ``at:<t>``: the ranks that have the notice stop after step ``t``: ``t`` is the furthest step any of them had
  reached when it looked, so nobody passed it. A rank at a boundary before ``t`` trains on to ``t``; a rank past
  ``t`` (or one that reaches ``t`` without the notice yet, and passes it) raises it to its own step;
- ``stop:<t>``: every rank arrived at ``t`` (the last one to arrive writes it): the gang stops there;
- ``closed``: a rank went into the regular sync at ``q``, which it makes without looking at the store again: no
  stop point before ``q`` is possible any more, and the gang stops at ``q``, the sync carrying the stop flag as it
  always did.

Every change goes through the store's compare-and-set, so every rank reads the same history. A rank that arrived at
``t`` waits for the doorbell ``<prefix>/<q>/d<t>``, which whoever moves the key off ``at:<t>`` rings, then reads the
key: ``stop:<t>`` is the stop, anything else means train on. A rank never waits for a peer that is inside a
collective: a peer goes into the regular sync only after closing the interval, which rings the doorbell. So the
protocol costs one compare-and-set per rank per regular sync when no notice comes, and a few store round trips per
rank when one does.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final, Protocol

PREFIX: Final = "shardyard/notice"
CLOSED: Final = "closed"
_AT: Final = "at:"
_STOP: Final = "stop:"


class NoticeError(RuntimeError):
    """The store holds what the protocol never writes (a key reused by another gang, or a protocol bug)."""


class Store(Protocol):
    """The part of ``torch.distributed.Store`` the protocol uses (``TCPStore`` in a shard, a fake in tests)."""

    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes: ...

    def add(self, key: str, value: int) -> int: ...

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> bytes: ...

    def wait(self, keys: list[str], timeout: timedelta) -> None: ...

    def delete_key(self, key: str) -> bool: ...


class NoticeStop:
    """One rank's side of the protocol: :meth:`closing` before every regular sync, :meth:`at_boundary` after every
    step once the rank has the notice."""

    def __init__(self, store: Store, world_size: int, *, timeout_s: float, prefix: str = PREFIX) -> None:
        self.store, self.world_size, self.prefix = store, world_size, prefix
        self.timeout = timedelta(seconds=timeout_s)
        self.closed: int | None = None
        """The regular sync this rank found its interval closed for: no store round trip until then."""

    def _key(self, sync_step: int) -> str:
        return f"{self.prefix}/{sync_step}"

    def _swap(self, key: str, expected: str, desired: str) -> str:
        """Compare-and-set; the value after it (``desired`` when the swap was made)."""
        return self.store.compare_set(key, expected, desired).decode()

    def _ring(self, key: str, step: int) -> None:
        self.store.set(f"{key}/d{step}", "1")

    def closing(self, sync_step: int) -> None:
        """Before the regular sync of ``sync_step``: no stop point before it from now on. A rank waiting at one is
        told to train on (to this sync, which stops the gang)."""
        key = self._key(sync_step)
        value = self._swap(key, "", CLOSED)
        while value != CLOSED:
            if not value.startswith(_AT):
                raise NoticeError(f"{key} is {value!r} as rank goes into the sync of step {sync_step}")
            after = self._swap(key, value, CLOSED)
            if after == CLOSED:
                self._ring(key, _step_of(value))
            value = after

    def forget(self, sync_step: int) -> None:
        """After the regular sync of ``sync_step``, on one rank (the runner's rank 0): every rank closed the interval
        before going into that sync and never reads its key again, so the key goes; else the store would keep one
        per sync for the whole run. The doorbells and counters of an interval with a notice stay: the gang stops
        at that sync."""
        self.store.delete_key(self._key(sync_step))

    def at_boundary(self, step: int, sync_step: int) -> bool:
        """After ``step``, this rank having the notice, in the interval that ends at the regular sync of
        ``sync_step`` (``step`` < ``sync_step``): True when the gang stops here (every rank returns True at the same
        step, and then makes the stop sync); False to train on. Blocks while waiting for the others to arrive, up to
        the timeout (``TimeoutError`` from the store past it)."""
        if self.world_size == 1:
            return True
        if self.closed == sync_step:
            return False
        key, mine = self._key(sync_step), f"{_AT}{step}"
        value = self._swap(key, "", mine)
        while value != mine:
            if value == CLOSED:
                self.closed = sync_step
                return False  # the sync at sync_step stops the gang: train on to it
            if value.startswith(_AT) and _step_of(value) > step:
                return False  # a peer is further on: train on to its step
            if not value.startswith(_AT):
                raise NoticeError(f"{key} is {value!r} at rank's step {step}")
            after = self._swap(key, value, mine)  # a stop point behind this rank: move it here
            if after == mine:
                self._ring(key, _step_of(value))
            value = after
        last = self.store.add(f"{key}/n{step}", 1) == self.world_size  # every rank is here: nobody can move it on
        if last and self._swap(key, mine, f"{_STOP}{step}") == f"{_STOP}{step}":
            self._ring(key, step)
        self.store.wait([f"{key}/d{step}"], self.timeout)
        return self.store.get(key).decode() == f"{_STOP}{step}"


def _step_of(value: str) -> int:
    return int(value.partition(":")[2])
