"""The placement core: ``schedule(snapshot, pending, policy, now) -> decisions``, pure. The scheduler service runs it
every cycle; the simulator (``shardyard.sim``) and the placement bench call the same function.

- ``model``           what the policy reads and returns: ``Policy``, ``NodeView``, ``Snapshot``, ``PendingJob``, the
                      decisions (``Place``, ``Preempt``, ``Unschedulable``, ``Invalid``)
- ``snapshot``        the snapshot built from node states and placed gangs (``build_snapshot``, ``SnapshotCache``)
- ``index``           the cycle's indexed working copy of the snapshot
- ``standing``        that index kept from cycle to cycle
- ``filters``         the filter table that placing and explaining both read
- ``candidate``       a pending job as a decision reads it, and the queue order
- ``gang_placement``  placing one gang on the index
- ``contention``      when a job does not fit: why, whom to preempt, what to reserve
- ``elastic``         an elastic job started below its preferred size
- ``surplus``         a running elastic gang's shards above its minimum, offered to preemption one by one
- ``cycle``           one cycle, in phases (``PlacementCycle``, ``schedule``)

Round-trip times between nodes come from ``shardyard.topology``.
"""
