"""A preemptor's claim on the GPUs its victims give back. Pure.

While its victims stop, a job that preempted holds their nodes when its turn comes (``worth.hold_room``). The cycle in
which the last of them has released its GPUs is the one that should place it there; but the jobs decided before it in
that cycle (higher in the queue, or earlier in the queues' fair-share turns) would see those GPUs free, take them,
and leave it to preempt again: in the simulator, one job of a team preempted 209 gangs of its own queue that way
before it started. So the nodes of a job's victims are remembered from cycle to cycle (``victims.hold_for`` records
them in ``ClusterIndex.claiming``; the next cycle reads ``claimed_before``). In the first cycle after they all
released, they are held for it from the cycle's start, given back to it at its own turn, and forgotten after that
cycle whatever it decided: a claim never outlives the release by more than one cycle.
"""

from collections.abc import Collection, Sequence

from shardyard.placement.index import ClusterIndex
from shardyard.placement.model import RunningJob


def hold(index: ClusterIndex, pending: Collection[str], running: Sequence[RunningJob]) -> None:
    """At the cycle's start: hold the nodes of the claims of the cycle before whose victims have all released (none
    of them ``running``), for their jobs still ``pending``."""
    if not index.claimed_before:
        return
    running_ids = {gang.job_id for gang in running}
    for job_id, (victims, nodes) in index.claimed_before.items():
        if job_id not in pending or not victims.isdisjoint(running_ids):
            continue  # placed, cancelled or gone; or still stopping (held at its turn, ``worth.hold_room``)
        held = index.held_claims.setdefault(job_id, [])
        for node_id in sorted(nodes):
            slot = index.slots.get(node_id)
            if slot is not None and index.usable(slot) and slot.reserved_for is None:
                index.reserve(slot, job_id)
                held.append(slot)


def give_back(index: ClusterIndex, job_id: str) -> bool:
    """At ``job_id``'s turn: the nodes held for it are its to place on. Whether there were any: what the cycle
    learnt of the jobs decided before (a shape that did not fit) no longer holds for it."""
    held = index.held_claims.pop(job_id, [])
    for slot in held:
        if slot.reserved_for == job_id:
            index.unreserve(slot)
    return bool(held)
