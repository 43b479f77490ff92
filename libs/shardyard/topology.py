"""Where nodes sit relative to each other: the round-trip time between two nodes, measured or estimated from their
topology labels (``zone``, ``rack``). Pure; the placement core ranks gangs with it and the monitor reports it."""

from collections.abc import Mapping
from typing import Protocol


class Located(Protocol):
    """Where a node sits: a placement ``NodeView``, or the placement index's slot for it (``shardyard.placement``)."""

    @property
    def node_id(self) -> str: ...
    @property
    def zone(self) -> str: ...
    @property
    def rack(self) -> str: ...


def estimated_rtt_ms(a: Located, b: Located, measured: Mapping[tuple[str, str], float]) -> float:
    """RTT between two nodes: measured when known, else estimated from their topology labels."""
    if a.node_id == b.node_id:
        return 0.0
    known = measured.get((a.node_id, b.node_id), measured.get((b.node_id, a.node_id)))
    if known is not None:
        return known
    if a.rack and a.rack == b.rack and a.zone == b.zone:
        return 0.1
    if a.zone and b.zone:
        return 0.5 if a.zone == b.zone else 5.0
    return 1.0
