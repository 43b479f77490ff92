"""The measured network as the monitor shows it: the agents' link measurements (the links topic) folded into a
``shardyard.links.LinkTable`` and judged by ``slow_links``. Pure: events and ``now`` in, figures out.

- **Live nodes only.** A node the pool calls LOST has its links forgotten, and measurements of its links read while
  it is LOST (a peer's last round, or the compacted topic's replay) are not kept: they say nothing of the cluster
  now. Once it is back its links are measured afresh.
- **One judgment a second.** The alert rules (twice a second), ``/metrics``, ``/api/links`` and a job's detail read
  the same figures, so ``Network.measured`` makes them once per change of the table and second of the clock, not
  once per reader: at 1,000 nodes the table holds some ten thousand directions.
- **The pairs shown** (``rtt_pairs``): up to ``RTT_PAIR_NODES`` live nodes, every pair, measured where a fresh
  measurement exists and else estimated from the topology labels as the scheduler estimates it; beyond that (pairs
  grow as n^2) only the ``WORST_LINKS`` worst measured links.
"""

import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from shardyard.events import LinkMeasured, NodeState
from shardyard.links import SLOW_MIN_EXCESS_MS, SLOW_RATIO, Link, LinkTable, SlowLink, pair, slow_links
from shardyard.topology import estimated_rtt_ms

Pair = tuple[str, str]
"""A node pair, sorted (``shardyard.links.pair``)."""
RTT_PAIR_NODES = 16
"""Up to this many live nodes, every pair is shown; beyond it only the worst measured links (pairs grow as n^2)."""
WORST_LINKS = 50
"""Measured links shown beyond ``RTT_PAIR_NODES`` live nodes: the worst, slow ones first."""


class RttSource(StrEnum):
    """Where an RTT the monitor shows comes from (the ``source`` label and field)."""

    MEASURED = "measured"
    """The agents' probes, recently (``LinkTable.max_age_s``)."""
    TOPOLOGY = "topology"
    """The scheduler's estimate from the two nodes' zone and rack labels."""
    MIXED = "mixed"
    """A node's mean over peers of which some were measured and some estimated."""
    NONE = "none"
    """A gang pair without a measurement, of a node the monitor has no state of: nothing to estimate from."""


@dataclass(frozen=True)
class Measured:
    """The fresh links at one moment and the judgment on them."""

    links: Mapping[Pair, Link]
    slow: Mapping[Pair, SlowLink]
    """The links ``slow_links`` names, slowest first."""
    rtt_limit_ms: float | None
    """The RTT above which a link is slow (``rtt_limit_ms``); None below three nodes."""
    ranked: tuple[Link, ...]
    """Every link, worst first: the slow ones in their order, then the rest by RTT, highest first."""

    def among(self, nodes: Collection[str]) -> list[Link]:
        """The links between two of ``nodes``, worst first."""
        return [link for link in self.ranked if link.a in nodes and link.b in nodes]


def rtt_limit_ms(links: Iterable[Link], ratio: float, min_excess_ms: float) -> float | None:
    """The RTT above which ``slow_links`` calls a link slow: ``ratio`` times the baseline (the median over nodes of
    each node's best link), and at least ``min_excess_ms`` above it. None below three nodes, where it judges none."""
    best: dict[str, float] = {}
    for link in links:
        for node in (link.a, link.b):
            best[node] = min(best.get(node, link.rtt_ms), link.rtt_ms)
    if len(best) < 3:
        return None
    baseline = statistics.median(best.values())
    return max(ratio * baseline, baseline + min_excess_ms)


def judge(links: Mapping[Pair, Link], ratio: float = SLOW_RATIO, min_excess_ms: float = SLOW_MIN_EXCESS_MS) -> Measured:
    found = slow_links(list(links.values()), ratio, min_excess_ms)
    slow = {(s.link.a, s.link.b): s for s in found}
    rest = sorted((link for key, link in links.items() if key not in slow), key=lambda link: (-link.rtt_ms, link.a))
    return Measured(
        links=links,
        slow=slow,
        rtt_limit_ms=rtt_limit_ms(links.values(), ratio, min_excess_ms),
        ranked=(*(s.link for s in found), *rest),
    )


@dataclass
class Network:
    """The link table of the live nodes, and its judgment kept for the second it was made in."""

    table: LinkTable = field(default_factory=LinkTable)
    slow_ratio: float = SLOW_RATIO
    slow_min_excess_ms: float = SLOW_MIN_EXCESS_MS
    lost: set[str] = field(default_factory=set)
    """Nodes the pool calls LOST now: their links are forgotten, and not kept until they are back."""
    changes: int = 0
    _kept: tuple[tuple[int, int], Measured] | None = field(default=None, repr=False)

    def apply(self, event: LinkMeasured) -> None:
        if event.node_id in self.lost or event.peer_id in self.lost:
            return
        self.table.apply(event)
        self.changes += 1

    def node_status(self, node_id: str, *, lost: bool) -> None:
        """The pool's verdict on a node: a LOST node's links go; one back from LOST is measured afresh."""
        if not lost:
            self.lost.discard(node_id)
        elif node_id not in self.lost:
            self.lost.add(node_id)
            self.table.forget(node_id)
            self.changes += 1

    def measured(self, now: datetime) -> Measured:
        """The fresh links at ``now`` and which are slow, made once per change and second."""
        key = (self.changes, int(now.timestamp()))
        if self._kept is None or self._kept[0] != key:
            self._kept = (key, judge(self.table.links(now), self.slow_ratio, self.slow_min_excess_ms))
        return self._kept[1]


# --- RTTs between nodes, measured or estimated ---------------------------------------------------------------------
@dataclass(frozen=True)
class Place:
    """Where a node sits, as ``shardyard.topology`` estimates RTTs from it (a ``Located``)."""

    node_id: str
    zone: str
    rack: str

    @classmethod
    def of(cls, node: NodeState) -> "Place":
        return cls(node.node_id, node.topology.get("zone", ""), node.topology.get("rack", ""))


def estimated_ms(a: NodeState, b: NodeState) -> float:
    """The scheduler's estimate from the two nodes' topology labels, with nothing measured."""
    return estimated_rtt_ms(Place.of(a), Place.of(b), {})


def rtt_pairs(
    live: Sequence[NodeState], measured: Measured, *, pair_nodes: int = RTT_PAIR_NODES, worst: int = WORST_LINKS
) -> dict[Pair, tuple[float, RttSource]]:
    """The pairs to show, by pair: (RTT in ms, ``MEASURED`` or ``TOPOLOGY``). Every pair of ``live`` when there are at
    most ``pair_nodes``, and the ``worst`` worst measured links in any case."""
    shown: dict[Pair, tuple[float, RttSource]] = {}
    if len(live) <= pair_nodes:
        ordered = sorted(live, key=lambda node: node.node_id)
        for i, a in enumerate(ordered):
            for b in ordered[i + 1 :]:
                link = measured.links.get((a.node_id, b.node_id))
                if link is not None:
                    shown[(a.node_id, b.node_id)] = (link.rtt_ms, RttSource.MEASURED)
                else:
                    shown[(a.node_id, b.node_id)] = (estimated_ms(a, b), RttSource.TOPOLOGY)
    for link in measured.ranked[:worst]:
        shown.setdefault((link.a, link.b), (link.rtt_ms, RttSource.MEASURED))
    return dict(sorted(shown.items()))


def mean_rtt(nodes: Sequence[NodeState], measured: Mapping[Pair, float]) -> dict[str, tuple[float, RttSource]]:
    """Each node's mean RTT to the others of ``nodes``, measured where ``measured`` has the pair, else estimated, and
    its source (``MEASURED``: every pair, ``TOPOLOGY``: none, else ``MIXED``). O(places^2 + measured pairs), not
    O(nodes^2): the estimates depend only on the two nodes' place (zone, rack), so they are summed per place, and
    each measured pair then replaces its estimate."""
    if len(nodes) < 2:
        return {}
    groups: dict[tuple[str, str], list[NodeState]] = {}
    for node in nodes:
        groups.setdefault((node.topology.get("zone", ""), node.topology.get("rack", "")), []).append(node)
    total: dict[str, float] = {}
    for place, members in groups.items():
        here = Place("a", *place)
        estimate = sum(
            (len(others) - (other == place)) * estimated_rtt_ms(here, Place("b", *other), {})
            for other, others in groups.items()
        )
        total.update(dict.fromkeys((node.node_id for node in members), estimate))
    by_id = {node.node_id: node for node in nodes}
    counted = dict.fromkeys(by_id, 0)
    for (a, b), ms in measured.items():
        if a != b and a in by_id and b in by_id:
            delta = ms - estimated_ms(by_id[a], by_id[b])
            for end in (a, b):
                total[end] += delta
                counted[end] += 1
    peers = len(nodes) - 1
    source = {0: RttSource.TOPOLOGY, peers: RttSource.MEASURED}
    return {node_id: (total[node_id] / peers, source.get(seen, RttSource.MIXED)) for node_id, seen in counted.items()}


# --- JSON ----------------------------------------------------------------------------------------------------------
def pair_json(a: str, b: str, measured: Measured, states: Mapping[str, NodeState]) -> dict[str, Any]:
    """One pair as the status API shows it: measured figures, or the topology estimate, and whether it is slow."""
    link, slow = measured.links.get(pair(a, b)), measured.slow.get(pair(a, b))
    if link is not None:
        return {
            "a": link.a,
            "b": link.b,
            "rtt_ms": link.rtt_ms,
            "rtt_p90_ms": link.rtt_p90_ms,
            "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
            "source": RttSource.MEASURED,
            "measured_at": link.measured_at.isoformat(),
            "slow": slow is not None,
            "why": slow.why if slow is not None else None,
        }
    first, second = pair(a, b)
    known = first in states and second in states
    return {
        "a": first,
        "b": second,
        "rtt_ms": estimated_ms(states[first], states[second]) if known else None,
        "rtt_p90_ms": None,
        "bandwidth_bytes_per_s": None,
        "source": RttSource.TOPOLOGY if known else RttSource.NONE,
        "measured_at": None,
        "slow": False,
        "why": None,
    }


def links_json(measured: Measured, live: Sequence[NodeState]) -> dict[str, Any]:
    """``/api/links``: the live nodes, and every measured link, worst first; up to ``RTT_PAIR_NODES`` live nodes,
    the topology estimates of the pairs not measured after them."""
    states = {node.node_id: node for node in live}
    shown = [pair_json(link.a, link.b, measured, states) for link in measured.ranked]
    if len(live) <= RTT_PAIR_NODES:
        shown += [
            pair_json(a, b, measured, states)
            for (a, b), (_ms, source) in rtt_pairs(live, measured, worst=0).items()
            if source == RttSource.TOPOLOGY
        ]
    return {
        "nodes": sorted(states),
        "rtt_limit_ms": measured.rtt_limit_ms,
        "slow": len(measured.slow),
        "links": shown,
    }


def gang_nodes(placements: Iterable[Mapping[str, Any]]) -> list[str]:
    """The distinct nodes a job's shards are placed on."""
    return sorted({str(p["node_id"]) for p in placements})


def gang_links_json(nodes: Sequence[str], measured: Measured, states: Mapping[str, NodeState]) -> list[dict[str, Any]]:
    """Every pair among a gang's nodes, measured or estimated, worst first (slow, then by RTT; unknown last)."""
    shown = [pair_json(a, b, measured, states) for i, a in enumerate(nodes) for b in nodes[i + 1 :]]
    return sorted(shown, key=lambda p: (not p["slow"], p["rtt_ms"] is None, -(p["rtt_ms"] or 0.0), p["a"], p["b"]))
