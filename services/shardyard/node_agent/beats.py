"""What an agent sends each beat: its full heartbeat, or a lease. Pure: time comes in.

The full heartbeat (every GPU, mounts, running shards, artifacts, topology: ~2 KB for 8 GPUs) goes out when what it
says beyond telemetry changed since the last one delivered, and every ``refresh_s`` regardless; every other beat is
a :class:`~shardyard.events.NodeLease` (~300 bytes: who, which beat, CPU load and each GPU's use). The resource pool
renews liveness from either, and takes the node's inventory from the last full heartbeat. At 10,000 nodes that turns
20 MB/s of heartbeats into 3 MB/s, and most of what the pool and the monitor decode into a few fields.
"""

from dataclasses import dataclass

from shardyard.events import Heartbeat, NodeLease, inventory_of, lease_of

DEFAULT_REFRESH_S = 60.0
"""A full heartbeat that says nothing new, this often: at 10,000 nodes a 10 s refresh was 1,000 records of ~2 KB a
second for the pool and every monitor to decode, for the one case it serves (a pool that never heard of the node)."""


@dataclass
class Beats:
    refresh_s: float = DEFAULT_REFRESH_S
    """A full heartbeat at least this often (monotonic seconds): a pool that never heard of the node (a new
    cluster, a lost full heartbeat) learns its inventory within this long."""
    _inventory: tuple[object, ...] | None = None
    _full_at: float | None = None

    def next(self, heartbeat: Heartbeat, now: float) -> Heartbeat | NodeLease:
        """What to send for ``heartbeat`` at ``now``: itself, or its lease."""
        return heartbeat if self.full_due(heartbeat, now) else lease_of(heartbeat)

    def full_due(self, heartbeat: Heartbeat, now: float) -> bool:
        """Whether ``heartbeat`` goes out whole at ``now`` (its refresh is due, or its inventory changed)."""
        if self._full_at is None or now - self._full_at >= self.refresh_s:
            return True
        return inventory_of(heartbeat) != self._inventory

    def delivered(self, beat: Heartbeat | NodeLease, now: float) -> None:
        """``beat`` reached the bus: a full heartbeat is what the pool knows of this node from now on."""
        if isinstance(beat, Heartbeat):
            self._inventory, self._full_at = inventory_of(beat), now
