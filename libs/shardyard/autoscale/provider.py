"""The node-provider interface: the one seam between the autoscaler's decisions and whatever makes machines.

The autoscaler decides (``shardyard.autoscaler.book``, pure); a provider only does what it is told and says what it
manages. Three calls:

- ``add(gpu_model, gpus_per_node, count)``: ask for ``count`` nodes, each with ``gpus_per_node`` GPUs of
  ``gpu_model``; returns the node ids being added, at once, before they run. A node counts as pending capacity in the
  autoscaler until its agent reports it ALIVE (``shardyard.nodes.state``) or its join timeout passes.
- ``remove(node_id)``: give the node back. The autoscaler drains it first (``NodeDrain``: no new shards) and calls
  this only once the node is idle; a provider stops it however it can. Removing a node it does not manage is a no-op.
- ``nodes()``: what it manages now, with when each was added (the autoscaler rebuilds its view from this at start).

How a real provider maps onto it:

- **A cloud instance group** (AWS Auto Scaling group, GCE managed instance group, Azure VM scale set) per GPU model:
  ``add`` raises the desired size by ``count`` (or creates instances from the group's template, whose start-up runs a
  node agent with ``--node-id`` set to the instance id); ``remove`` terminates that instance (detaching it with
  ``should-decrement-desired-capacity``); ``nodes`` lists the group's instances.
- **A Kubernetes node pool, or Karpenter**: ``add`` scales the pool of that GPU model up by ``count`` (with Karpenter,
  creates ``count`` NodeClaims of its NodePool); the node agent runs as a DaemonSet with the Kubernetes node name as
  its node id; ``remove`` cordons and deletes that Node (or its NodeClaim); ``nodes`` lists the pool's Nodes.
- **Slurm's power saving**: the nodes are declared in ``slurm.conf`` with ``State=CLOUD``; ``add`` runs
  ``scontrol power up`` on ``count`` powered-down nodes of the partition of that model (``ResumeProgram`` boots them
  and starts their agents); ``remove`` runs ``scontrol power down`` (``SuspendProgram``); ``nodes`` lists the
  partition's powered-up nodes.

The ``command`` provider (``shardyard.autoscale.command``) runs an operator's scripts for the first two, so any of
these plugs in without Python; the ``local`` provider (``shardyard.autoscale.local``) starts node-agent processes for
``shardyard up --autoscale``. Errors are ``ProviderError``: the autoscaler logs and counts them and goes on.
"""

from dataclasses import dataclass
from typing import Protocol

from shardyard.errors import ShardyardError


class ProviderError(ShardyardError):
    """A provider could not do what it was asked (a script failed or timed out, a process would not start)."""


@dataclass(frozen=True)
class ProvidedNode:
    node_id: str
    gpu_model: str
    gpus: int
    added_at: float
    """Seconds since the epoch: when it was asked for."""


class NodeProvider(Protocol):
    """Adds and removes nodes of declared GPUs. Implementations may block (a script, a process start): the autoscaler
    calls them off its event loop."""

    name: str

    def add(self, gpu_model: str, gpus_per_node: int, count: int) -> list[str]:
        """Ask for ``count`` nodes of ``gpus_per_node`` x ``gpu_model``; the ids of the nodes being added."""
        ...

    def remove(self, node_id: str) -> None:
        """Give ``node_id`` back (it was drained and is idle); a node not managed here is a no-op."""
        ...

    def nodes(self) -> list[ProvidedNode]:
        """The nodes this provider manages now."""
        ...

    def close(self) -> None:
        """The autoscaler stops: a provider whose nodes live only as long as it does (``local``) stops them."""
        ...
