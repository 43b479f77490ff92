"""Measured links, pure: which peers an agent probes, the latest figures per node pair, and which links are slow.

- **Whom to probe** (``peers_to_probe``): a node probes the nodes it shares a gang with, plus ``k`` others from a
  rotating sample. The sample walks a permutation of the other nodes that is fixed per node (a hash of both ids),
  ``k`` a round, so every link is measured within ``ceil(n / k)`` rounds while each node sends O(k) probes a round,
  at 10 nodes as at 10,000.
- **One figure per pair** (``LinkTable``): each direction is measured by its own end; a pair's RTT is the lower of
  the two directions' medians that are fresh (younger than ``max_age_s``): a probe's round trip runs through its
  prober's event loop, so a busy prober measures high and never low. Its bandwidth is the lower of the two.
- **Slow links** (``slow_links``): the cluster's baseline RTT is the median, over nodes, of each node's best link;
  a link is slow when its RTT exceeds both ``ratio`` times that and the baseline plus ``min_excess_ms`` (so a
  0.05 ms link against a 0.02 ms baseline is not "slow", nor a 4 ms one measured by agents on a busy host). A
  node on the far end of a slow access link has no good link at all, so its own best link does not raise the
  baseline while most nodes are healthy. Bandwidth likewise: slow when below the nodes' median best bandwidth over
  ``width_ratio``.
"""

import hashlib
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from shardyard.events import LinkMeasured

SLOW_RATIO = 2.0
"""A slow link's RTT is above this many times the baseline (and ``SLOW_MIN_EXCESS_MS`` above it)."""
SLOW_WIDTH_RATIO = 3.0
"""A slow link's bandwidth is below the baseline over this (one short burst is a noisy figure)."""
SLOW_MIN_EXCESS_MS = 5.0
"""A slow link is this much above the baseline at least: on a loaded host, loopback probes measure a few ms."""


def _rank(node_id: str, peer_id: str) -> bytes:
    return hashlib.blake2b(f"{node_id}|{peer_id}".encode(), digest_size=8).digest()


def peers_to_probe(node_id: str, others: Iterable[str], gang_peers: Iterable[str], k: int, round_no: int) -> list[str]:
    """This round's peers of ``node_id``: every gang peer, then ``k`` more of ``others`` from its rotating sample."""
    gang = sorted({p for p in gang_peers if p != node_id})
    rest = sorted((p for p in set(others) if p != node_id and p not in gang), key=lambda p: _rank(node_id, p))
    if not rest or k <= 0:
        return gang
    start = (round_no * k) % len(rest)
    sample = [rest[(start + i) % len(rest)] for i in range(min(k, len(rest)))]
    return gang + sample


def pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


@dataclass(frozen=True)
class Link:
    """One node pair's figures, from the fresh measurements of either direction."""

    a: str
    b: str
    rtt_ms: float
    rtt_p90_ms: float
    bandwidth_bytes_per_s: float | None
    measured_at: datetime


@dataclass
class LinkTable:
    """The latest measurement of each direction of each link, as read off the links topic."""

    max_age_s: float = 120.0
    latest: dict[tuple[str, str], LinkMeasured] = field(default_factory=dict)
    bandwidth: dict[tuple[str, str], tuple[float, datetime]] = field(default_factory=dict)
    """The last burst's throughput per direction, kept across rounds without a burst."""

    def apply(self, event: LinkMeasured) -> None:
        key = (event.node_id, event.peer_id)
        known = self.latest.get(key)
        if known is not None and known.occurred_at > event.occurred_at:
            return
        self.latest[key] = event
        if event.bandwidth_bytes_per_s is not None:
            self.bandwidth[key] = (event.bandwidth_bytes_per_s, event.occurred_at)

    def forget(self, node_id: str) -> None:
        """Drop every link of a node that is gone."""
        for key in [k for k in self.latest if node_id in k]:
            del self.latest[key]
        for key in [k for k in self.bandwidth if node_id in k]:
            del self.bandwidth[key]

    def evict(self, now: datetime) -> None:
        """Forget the measurements too old to be used (their bandwidth figures after five times that): the table
        holds the fresh links, not every pair the rotating samples ever met."""
        old = [key for key, event in self.latest.items() if (now - event.occurred_at).total_seconds() > self.max_age_s]
        for key in old:
            del self.latest[key]
        gone = [k for k, (_w, at) in self.bandwidth.items() if (now - at).total_seconds() > self.max_age_s * 5]
        for key in gone:
            del self.bandwidth[key]

    def links(self, now: datetime, among: set[str] | None = None) -> dict[tuple[str, str], Link]:
        """One ``Link`` per pair with a fresh measurement (of nodes in ``among`` only, if given)."""
        self.evict(now)
        ends: dict[tuple[str, str], list[LinkMeasured]] = {}
        for (node, peer), event in self.latest.items():
            if among is not None and (node not in among or peer not in among):
                continue
            if (now - event.occurred_at).total_seconds() > self.max_age_s:
                continue
            ends.setdefault(pair(node, peer), []).append(event)
        found = {}
        for (a, b), events in ends.items():
            widths = [
                width
                for key in ((a, b), (b, a))
                if (entry := self.bandwidth.get(key)) is not None
                for width in [entry[0]]
                if (now - entry[1]).total_seconds() <= self.max_age_s * 5
            ]
            found[(a, b)] = Link(
                a=a,
                b=b,
                rtt_ms=min(e.rtt_median_ms for e in events),
                rtt_p90_ms=max(e.rtt_p90_ms for e in events),
                bandwidth_bytes_per_s=min(widths) if widths else None,
                measured_at=max(e.occurred_at for e in events),
            )
        return found

    def rtt_ms(self, now: datetime, among: set[str] | None = None) -> dict[tuple[str, str], float]:
        """The measured RTT of each fresh pair, as the placement core takes it (``Snapshot.rtt_ms``)."""
        return {key: link.rtt_ms for key, link in self.links(now, among).items()}


@dataclass(frozen=True)
class SlowLink:
    link: Link
    why: str
    """e.g. "RTT 20.3 ms, 51x the cluster's 0.4 ms" or "12 MB/s, 1/8 of the cluster's 100 MB/s"."""


def slow_links(
    links: Sequence[Link],
    ratio: float = SLOW_RATIO,
    min_excess_ms: float = SLOW_MIN_EXCESS_MS,
    width_ratio: float = SLOW_WIDTH_RATIO,
) -> list[SlowLink]:
    """The links out of line with the cluster's (see the module's doc), slowest first."""
    best_rtt: dict[str, float] = {}
    best_width: dict[str, float] = {}
    for link in links:
        for node in (link.a, link.b):
            best_rtt[node] = min(best_rtt.get(node, link.rtt_ms), link.rtt_ms)
            if link.bandwidth_bytes_per_s is not None:
                best_width[node] = max(best_width.get(node, 0.0), link.bandwidth_bytes_per_s)
    if len(best_rtt) < 3:
        return []  # two nodes, one link: nothing to compare it with
    rtt_base = statistics.median(best_rtt.values())
    width_base = statistics.median(best_width.values()) if len(best_width) >= 3 else None
    found = []
    for link in links:
        if link.rtt_ms > max(ratio * rtt_base, rtt_base + min_excess_ms):
            found.append(
                (
                    link.rtt_ms / max(rtt_base, 1e-6),
                    SlowLink(link, f"RTT {link.rtt_ms:.1f} ms, the cluster's {rtt_base:.2f} ms"),
                )
            )
        elif (
            width_base is not None
            and link.bandwidth_bytes_per_s is not None
            and link.bandwidth_bytes_per_s < width_base / width_ratio
        ):
            found.append(
                (
                    width_base / link.bandwidth_bytes_per_s,
                    SlowLink(
                        link,
                        f"{link.bandwidth_bytes_per_s / 1e6:.1f} MB/s, the cluster's {width_base / 1e6:.1f} MB/s",
                    ),
                )
            )
    return [slow for _, slow in sorted(found, key=lambda item: -item[0])]
