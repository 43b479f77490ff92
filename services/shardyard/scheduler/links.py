"""What the scheduler knows of the network: the agents' link measurements (the links topic), as the placement core
takes them: measured RTTs per node pair, each node's mean measured RTT, and the nodes with slow links."""

import statistics
from dataclasses import dataclass, field
from datetime import datetime

from shardyard.events import LinkMeasured
from shardyard.links import LinkTable, slow_links

REFRESH_S = 10.0
"""The derived figures are worked out again at most this often (and only when a measurement came in since): at
1,000 probing nodes the table holds about 200,000 fresh directions and one refresh takes seconds
(``bench/link_probes.py``)."""


@dataclass(frozen=True)
class LinkFigures:
    rtt_ms: dict[tuple[str, str], float] = field(default_factory=dict)
    mean_rtt_ms: dict[str, float] = field(default_factory=dict)
    slow_nodes: frozenset[str] = frozenset()


def slow_nodes_of(table: LinkTable, now: datetime) -> frozenset[str]:
    """Nodes with at least half of their measured links slow: their own access to the network is slow (a slow link
    between two nodes that are fast to everyone else only breaks ties, see ``choose_by_latency``)."""
    links = list(table.links(now).values())
    slow: dict[str, int] = {}
    total: dict[str, int] = {}
    for link in links:
        for node in (link.a, link.b):
            total[node] = total.get(node, 0) + 1
    for found in slow_links(links):
        for node in (found.link.a, found.link.b):
            slow[node] = slow.get(node, 0) + 1
    return frozenset(node for node, count in slow.items() if count * 2 >= total[node])


@dataclass
class LinkView:
    table: LinkTable = field(default_factory=LinkTable)
    _figures: LinkFigures = field(default_factory=LinkFigures)
    _changed: bool = False
    _at: datetime | None = None

    def apply(self, event: LinkMeasured) -> None:
        self.table.apply(event)
        self._changed = True

    def forget(self, node_id: str) -> None:
        self.table.forget(node_id)
        self._changed = True

    def figures(self, now: datetime) -> LinkFigures:
        stale = self._at is None or (now - self._at).total_seconds() >= REFRESH_S
        if stale and (self._changed or self._figures.rtt_ms):
            rtt = self.table.rtt_ms(now)
            per_node: dict[str, list[float]] = {}
            for (a, b), ms in rtt.items():
                per_node.setdefault(a, []).append(ms)
                per_node.setdefault(b, []).append(ms)
            means = {node: statistics.fmean(values) for node, values in per_node.items()}
            self._figures = LinkFigures(rtt, means, slow_nodes_of(self.table, now))
            self._changed, self._at = False, now
        return self._figures
