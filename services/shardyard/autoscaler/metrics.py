"""The autoscaler's own Prometheus families, on the process's ``--metrics-port`` beside every process's
(``shardyard.metrics``), module globals on the default registry as those are:

- ``shardyard_autoscaler_nodes{model,phase}``: the nodes it manages, by GPU model and phase (JOINING, ALIVE,
  DRAINING, REMOVING)
- ``shardyard_autoscaler_actions_total{action,outcome}``: ``add`` (one per node), ``drain``, ``remove`` that ``ok``
  or ``failed`` (a provider's script or process that failed; the service goes on), and ``join``/``failed``: a node
  whose agent died before it ever came ALIVE
"""

from collections.abc import Mapping

from prometheus_client import Counter, Gauge

NODES = Gauge("shardyard_autoscaler_nodes", "Nodes the autoscaler manages", ["model", "phase"])
ACTIONS = Counter("shardyard_autoscaler_actions", "Scale actions the autoscaler took", ["action", "outcome"])

_shown: set[tuple[str, str]] = set()


def show_nodes(counts: Mapping[tuple[str, str], int]) -> None:
    """Set the gauge to ``counts``; a (model, phase) no longer there goes to 0."""
    for key in _shown | set(counts):
        NODES.labels(*key).set(counts.get(key, 0))
    _shown.update(counts)
