"""Self-fencing, pure: when an agent that cannot reach the bus must stop its shards.

The resource pool declares a silent node LOST after its bound (10 s by default) and its GPUs may then be given to
another gang. An agent whose heartbeats have not gone out for ``lease_s`` (below that bound) stops its shards
first, so that a shard attempt never runs twice at once (no zombies). "Gone out" means the heartbeat's publish was
acknowledged: one that failed, or hung, does not renew the lease.
"""

DEFAULT_LEASE_S = 6.0
CHECK_INTERVAL_S = 0.5


def lease_expired(now: float, last_ok: float, lease_s: float) -> bool:
    """Whether ``lease_s`` have passed (monotonic seconds) since the last heartbeat that reached the bus."""
    return now - last_ok >= lease_s


def fence_message(unreachable_s: float) -> str:
    return f"self-fenced: bus unreachable for {unreachable_s:.1f} s"
