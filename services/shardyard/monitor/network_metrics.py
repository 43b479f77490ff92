"""The network's families of the monitor's ``/metrics``: heartbeat transit, RTTs between nodes, links' bandwidth and
the links judged slow (what SLOW_LINK judges, for Prometheus's twin of it).

An RTT is ``source="measured"`` where the agents' probes measured the pair recently (``monitor/network.py``), and
the scheduler's estimate from zone and rack labels (``source="topology"``) only where they did not. Series stay
bounded as pairs grow as n^2: every pair up to ``RTT_PAIR_NODES`` live nodes, beyond that the ``WORST_LINKS`` worst
measured links, and each node's mean RTT to all the others in any case.
"""

from collections.abc import Iterator
from datetime import datetime

from shardyard.events import NodeStatus
from shardyard.monitor.exposition import Family
from shardyard.monitor.network import RTT_PAIR_NODES, WORST_LINKS, mean_rtt, rtt_pairs
from shardyard.monitor.views import ClusterView


def network_families(view: ClusterView, now: datetime) -> Iterator[Family]:
    yield _heartbeat_lag(view)
    measured = view.network.measured(now)
    live = [node for node in view.nodes.values() if node.gpus and node.status is not NodeStatus.LOST]
    pairs = Family(
        "shardyard_node_rtt_seconds",
        f"Round-trip time between two nodes, each pair once: measured by the agents' probes, else the topology "
        f"estimate; every pair up to {RTT_PAIR_NODES} live nodes, beyond that the {WORST_LINKS} worst measured links",
        ["node", "peer", "source"],
    )
    width = Family(
        "shardyard_link_bandwidth_bytes_per_second",
        "A link's measured throughput (the lower of its two directions' last bursts), for the pairs RTTs are shown of",
        ["node", "peer"],
    )
    for (a, b), (ms, source) in rtt_pairs(live, measured).items():
        pairs.add((a, b, source), ms / 1000.0)
        link = measured.links.get((a, b))
        if link is not None and link.bandwidth_bytes_per_s is not None:
            width.add((a, b), link.bandwidth_bytes_per_s)
    mean = Family(
        "shardyard_node_mean_rtt_seconds",
        "Mean round-trip time from a node to every other live node (source: measured, topology, or mixed)",
        ["node", "source"],
    )
    fresh = {key: link.rtt_ms for key, link in measured.links.items()}
    for node_id, (ms, source) in sorted(mean_rtt(live, fresh).items()):
        mean.add((node_id, source), ms / 1000.0)
    slow = Family(
        "shardyard_link_slow",
        "1 for each measured link out of line with the cluster's now (RTT or bandwidth; what SLOW_LINK judges)",
        ["node", "peer"],
    )
    for a, b in measured.slow:
        slow.add((a, b), 1)
    yield from (pairs, width, mean, slow)


def _heartbeat_lag(view: ClusterView) -> Family:
    lag = Family(
        "shardyard_heartbeat_lag_seconds",
        "Arrival of a node's last heartbeat at the monitor minus its occurred_at (transit, plus clock skew)",
        ["node"],
    )
    for node_id, seconds in sorted(view.telemetry.heartbeat_lag_s.items()):
        state = view.nodes.get(node_id)
        if state is None or state.status is not NodeStatus.LOST:  # a lost node's last figure says nothing now
            lag.add((node_id,), seconds)
    return lag
