"""Measured network links: what a node agent's probe found on its link to a peer (compacted, keyed by the pair)."""

from typing import Literal

from pydantic import Field

from shardyard.events.base import Event


def link_key(node_id: str, peer_id: str) -> str:
    """The record key of a link measurement: the prober, then the peer (each direction is measured, and kept, on its
    own; readers that want one figure per pair take both, see ``shardyard.links``)."""
    return f"{node_id}|{peer_id}"


class LinkMeasured(Event):
    """One probe round of ``node_id``'s link to ``peer_id``: TCP round trips over one connection (median, p90) and,
    on some rounds, the throughput of one short burst. ``occurred_at`` is when it was measured."""

    type: Literal["link.measured"] = "link.measured"
    node_id: str = Field(description="the node that measured (the prober)")
    peer_id: str
    rtt_median_ms: float = Field(ge=0)
    rtt_p90_ms: float = Field(ge=0)
    samples: int = Field(ge=1, description="round trips behind the median and p90")
    bandwidth_bytes_per_s: float | None = Field(
        default=None, gt=0, description="one burst's throughput; None on rounds without a burst"
    )
    burst_bytes: int = Field(default=0, ge=0, description="the burst's size (0 on rounds without a burst)")
    shared_with_sync: bool = Field(
        default=False,
        description="a gang training across this link was running while the round ran: its syncs may have shared"
        " the link with the probe (no burst is sent on such a link after the gang started)",
    )
