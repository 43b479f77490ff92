"""A node's health after a straggler was swapped off it: **degraded** for ``DEGRADED_S`` from the swap, then healthy
again (it recovers as it behaves: a node that straggles again is swapped off again, and degraded anew). The fault
manager swaps nothing onto a degraded node; placement ranks it last (``Snapshot.degraded``). Both read it off the
same ``JobStraggling`` events, so every replica agrees. Pure."""

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Final

from shardyard.events import JobStraggling, StragglerAction

DEGRADED_S: Final = 600.0


def degraded_until(event: JobStraggling, degraded_s: float = DEGRADED_S) -> datetime | None:
    """Until when ``event`` makes its node degraded; None when it swapped nothing."""
    if event.action is not StragglerAction.SWAP or event.shard_index is None:
        return None
    return event.occurred_at + timedelta(seconds=degraded_s)


def note(degraded: dict[str, datetime], event: JobStraggling, degraded_s: float = DEGRADED_S) -> None:
    """Record ``event`` in ``degraded`` (node -> until when), keeping the later end."""
    until = degraded_until(event, degraded_s)
    if until is not None:
        degraded[event.node_id] = max(until, degraded.get(event.node_id, until))


def degraded_now(degraded: Mapping[str, datetime], now: datetime) -> frozenset[str]:
    return frozenset(node for node, until in degraded.items() if until > now)
