"""Node inventory, liveness, drain marks and the reservations ledger (``ledger``). Pure: receive times come in as
arguments.

Agents send a full heartbeat (inventory and telemetry) when their inventory changes and on a slow refresh, and a
small lease (liveness and telemetry, :class:`~shardyard.events.NodeLease`) every other second; both renew liveness.

A node is ALIVE while it heartbeats, SUSPECT after ``suspect_after_s`` of silence and LOST after ``lost_after_s``;
a LOST node that heartbeats again is ALIVE again (its old shards were failed meanwhile). A node whose agent reported
stalls of its own (a loaded host: ``shardyard.liveness``) is suspected later by the margin its last beat carried, at
most ``liveness.MAX_MARGIN_S``; LOST stays at ``lost_after_s``.

Silence runs from the *sending* of the node's last heartbeat (its ``occurred_at``), not from when the pool read it: a
node that died just after a heartbeat has been dead for as long as the heartbeat took to arrive. The agent's clock is
trusted for at most :data:`MAX_TRANSIT_S` of that (a clock ahead of ours counts from the receipt, one far behind
cannot make a node suspect early by more). The periodic check is allowed for too: a node is SUSPECT at the first
check at least ``suspect_after_s - check_every_s`` into its silence, so never later than ``suspect_after_s``, and
LOST likewise by ``lost_after_s``.

Replicas split the nodes by the partition of the heartbeats topic their heartbeats land on (:attr:`PoolBook.owned`,
given by the consumer group): a replica judges the liveness of the nodes it owns and publishes their state; it keeps
the other nodes' state from the node-state topic, ready to take them over. A replica that takes nodes over, or
finds it was not running for a while (:attr:`PoolBook.pause_after_s`), suspects no ALIVE node for
:attr:`PoolBook.catch_up_s`: the heartbeats it has yet to read may clear them. Past that, it suspects no node of a
partition it has not read up to the present (no heartbeat sent since then read from it) for a whole suspicion window:
a slow read of a long backlog is not silence.

Node state is published when it changes, not per heartbeat: its status, drain mark or reservations; its inventory
(GPUs and their health, cores, memory, address, running shards, artifacts, topology, its output disk's free space by
10 % steps); its CPU load or a GPU's use by
a :class:`~shardyard.resource_pool.telemetry.Tolerance` step. Unchanged, a node's state is still republished every
:attr:`PoolBook.refresh_s` (its last heartbeat's receipt stays fresh on the compacted topic), and once after each
takeover or restart of a replica. A heartbeat that changes nothing costs one comparison.

The periodic check costs what changes too: the nodes a replica judges are kept in the order their last heartbeat
arrived, and a check reads them from the oldest until the first whose silence is short of suspicion.

An operator drains a node (``NodeDrain``, on the heartbeats topic): it takes no new shards until undrained. The mark
is the pool's, not the agent's: it outlives heartbeats and agent restarts, and comes back from the compacted
node-state topic when the pool restarts.
"""

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Final

from shardyard.bus.topics import HEARTBEATS, partition_of
from shardyard.events import (
    Event,
    Heartbeat,
    NodeDrain,
    NodeLease,
    NodeLeases,
    NodeLost,
    NodeState,
    NodeStatus,
    RunningShard,
    inventory_of,
)
from shardyard.liveness import MAX_MARGIN_S
from shardyard.resource_pool.ledger import Key, Ledger
from shardyard.resource_pool.telemetry import Telemetry, Tolerance, moved

STATE_REFRESH_S: Final = 300.0
"""How often an unchanged node's state is republished: every replica of the scheduler, fault manager, monitor and
pool and every agent reads each one, so at 10,000 nodes a 30 s refresh was 333 states a second read by all of them."""
MAX_TRANSIT_S: Final = 0.5
"""How much earlier than its receipt a heartbeat's own timestamp may start the node's silence."""


@lru_cache(maxsize=1 << 17)
def heartbeat_partition(node_id: str) -> int:
    """The heartbeats partition of ``node_id``, hashed once a node: murmur2 in Python costs ~20 µs, and a tick that
    holds back the partitions catching up asks it of every node it reads, a relayed record of every lease."""
    return partition_of(node_id, HEARTBEATS)


def keys_of(running: Iterable[RunningShard]) -> list[Key]:
    return [(r.job_id, r.shard_index, r.attempt) for r in running]


def silent_since(beat: Heartbeat | NodeLease, received_at: datetime) -> datetime:
    transit = (received_at - beat.occurred_at).total_seconds()
    return received_at - timedelta(seconds=min(max(transit, 0.0), MAX_TRANSIT_S))


@dataclass
class NodeRecord:
    heartbeat: Heartbeat
    """The node's last full heartbeat: its inventory (its telemetry is ``telemetry``, renewed by leases too)."""
    received_at: datetime
    status: NodeStatus = NodeStatus.ALIVE
    draining: bool = False
    silent_since: datetime | None = None
    """When the node went quiet: the sending of its last heartbeat (see :func:`silent_since`); the receipt if None."""
    seq: int = 0
    """The agent's newest beat (full heartbeat or lease) read."""
    margin_s: float = 0.0
    """How much later than ``suspect_after_s`` the node is suspected: its last beat's margin (its agent's stalls)."""
    inventory: tuple[object, ...] = ()
    telemetry: Telemetry | None = None
    published: tuple[tuple[object, ...], Telemetry] | None = None
    """The inventory and telemetry of the node's last published state, with ``published_at`` its time; None:
    publish with the next beat."""
    published_at: datetime | None = None

    def __post_init__(self) -> None:
        self.seq = self.heartbeat.seq
        self.inventory = inventory_of(self.heartbeat)
        self.telemetry = Telemetry.of(self.heartbeat)

    def silence(self, now: datetime) -> float:
        return (now - (self.silent_since or self.received_at)).total_seconds()


@dataclass
class PoolBook:
    suspect_after_s: float = 3.0
    lost_after_s: float = 10.0
    check_every_s: float = 0.0
    """How often ``tick`` is called: a node is suspected that much early rather than up to that much late."""
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    ledger: Ledger = field(default_factory=Ledger)
    """The GPUs each assignment reserves, by node, and when they are released (orphans included)."""
    owned: frozenset[int] | None = None
    """The heartbeats partitions whose nodes this replica judges and publishes; None: every node (one replica)."""
    pause_after_s: float | None = None
    """A gap this long between two ticks means this replica was not running (paused, starved): the nodes it owns get
    a fresh silence window instead of being suspected. None: never assumed."""
    last_tick: datetime | None = None
    catch_up_s: float = 1.0
    """After a takeover or a pause, the time an ALIVE node gets before it may be suspected: long enough to read the
    heartbeats that came meanwhile, short enough that a node that died meanwhile is still suspected quickly."""
    catching_up: dict[int, datetime] = field(default_factory=dict)
    """The owned partitions not read up to the present since a takeover or a pause, and when that began: their nodes
    are not suspected until one of their heartbeats sent since then is read, or ``suspect_after_s`` has passed."""
    refresh_s: float = STATE_REFRESH_S
    """An unchanged node's state is republished this often."""
    tolerance: Tolerance = field(default_factory=Tolerance)
    watched: "OrderedDict[str, None]" = field(default_factory=OrderedDict)
    """The owned nodes that are not LOST, by the receipt of their last heartbeat, oldest first: what ``tick`` reads."""
    blind: bool = False
    """The last tick found the broker out of reach (see ``tick``)."""
    _unordered: bool = False
    """``watched`` must be sorted again (nodes were restored or taken over out of receipt order)."""

    def owns(self, node_id: str) -> bool:
        return self.owned is None or heartbeat_partition(node_id) in self.owned

    def assign(self, partitions: Iterable[int], now: datetime) -> None:
        """The group gave this replica ``partitions`` (all it owns from now on): the heartbeats since the previous
        owner's last are yet to be read, so no node of them is suspected for ``catch_up_s``."""
        self.owned = frozenset(partitions)
        for record in self.nodes.values():
            record.published = None  # a takeover republishes each node once: the new owner's word on it
        self._grace(now)
        self._unordered = True

    def _grace(self, now: datetime) -> None:
        earliest = now - timedelta(seconds=max(self.suspect_after_s - self.catch_up_s, 0.0))
        for node_id, record in self.nodes.items():
            if record.status is NodeStatus.ALIVE and self.owns(node_id):
                record.silent_since = max(record.silent_since or record.received_at, earliest)
        owned = range(HEARTBEATS.partitions) if self.owned is None else self.owned
        self.catching_up = dict.fromkeys(owned, now)

    def _still_catching_up(self, now: datetime) -> frozenset[int]:
        """The partitions whose nodes are not suspected now (see :attr:`catching_up`); those past it are dropped."""
        window = timedelta(seconds=self.suspect_after_s)
        self.catching_up = {p: since for p, since in self.catching_up.items() if now - since < window}
        return frozenset(self.catching_up)

    def _watch_order(self) -> None:
        """Rebuild ``watched`` from every owned node that is not LOST, oldest receipt first."""
        judged = [
            (record.received_at, node_id)
            for node_id, record in self.nodes.items()
            if record.status is not NodeStatus.LOST and self.owns(node_id)
        ]
        self.watched = OrderedDict((node_id, None) for _, node_id in sorted(judged))
        self._unordered = False

    def observe(self, state: NodeState) -> None:
        """Another replica's publication: kept for a node this replica does not own (it may take it over)."""
        if not self.owns(state.node_id):
            self.restore(state)

    def state_of(self, node_id: str, now: datetime) -> NodeState:
        """The node's state to publish now (recorded as its last published one)."""
        record = self.nodes[node_id]
        hb = record.heartbeat
        live = record.telemetry or Telemetry.of(hb)
        record.published, record.published_at = (record.inventory, live), now
        allocated = self.ledger.gpus_of(node_id)
        return NodeState(
            occurred_at=now,
            node_id=node_id,
            status=record.status,
            agent_instance=hb.agent_instance,
            host=hb.host,
            address=hb.address,
            rendezvous_ports=hb.rendezvous_ports,
            probe_port=hb.probe_port,
            last_heartbeat_at=record.received_at,
            last_beat_seq=record.seq,
            gpus=live.gpus(hb.gpus),
            allocated_gpus=allocated,
            cpu_cores=hb.cpu_cores,
            memory_bytes=hb.memory_bytes,
            cpu_load=live.cpu_load,
            running=hb.running,
            artifacts=hb.artifacts,
            artifacts_absent=tuple(sorted({*hb.artifacts_absent, *hb.artifact_errors})),
            mounts=hb.mounts,
            topology=hb.topology,
            draining=record.draining,
            output_disk=hb.output_disk,
        )

    def on_heartbeat(self, heartbeat: Heartbeat, now: datetime) -> list[Event]:
        """A full heartbeat: the node is alive, and this is its inventory now."""
        record = self.nodes.get(heartbeat.node_id)
        same_agent = record is not None and record.heartbeat.agent_instance == heartbeat.agent_instance
        if same_agent and record is not None and heartbeat.seq <= record.seq:
            return []  # believed once: an older or the same beat again is a replay (bus.seal refuses most before)
        if record is None:
            record = self.nodes[heartbeat.node_id] = NodeRecord(heartbeat, now)
        else:
            record.heartbeat, record.seq = heartbeat, heartbeat.seq
            record.inventory, record.telemetry = inventory_of(heartbeat), Telemetry.of(heartbeat)
        self.ledger.reported(heartbeat.node_id, keys_of(heartbeat.running), now)
        return self._renewed(heartbeat.node_id, record, heartbeat, now)

    def on_lease(self, lease: NodeLease, now: datetime) -> list[Event]:
        """A lease: the node is alive, with this telemetry. A lease of an agent the pool has no full heartbeat of
        (a node it never heard of, or an agent restarted) says nothing it can publish: the agent's next full
        heartbeat, due at the latest on its refresh, introduces it."""
        record = self.nodes.get(lease.node_id)
        if record is None or record.heartbeat.agent_instance != lease.agent_instance or lease.seq <= record.seq:
            return []  # believed once, as a full heartbeat
        record.seq = lease.seq
        record.telemetry = (record.telemetry or Telemetry.of(record.heartbeat)).renewed(lease)
        return self._renewed(lease.node_id, record, lease, now)

    def on_leases(self, relayed: NodeLeases, now: datetime) -> list[Event]:
        """A relay's batch of leases: each one as if it came alone, for the nodes this replica owns. A lease of a node
        another replica owns is not this replica's to judge (the relay put it in the wrong partition): ignored."""
        out: list[Event] = []
        for lease in relayed.leases:
            if self.owns(lease.node_id):
                out.extend(self.on_lease(lease, now))
        return out

    def _renewed(self, node_id: str, record: NodeRecord, beat: Heartbeat | NodeLease, now: datetime) -> list[Event]:
        was = record.status
        record.margin_s = min(beat.margin_s, MAX_MARGIN_S)
        record.status, record.received_at, record.silent_since = NodeStatus.ALIVE, now, silent_since(beat, now)
        if self.catching_up:
            partition = heartbeat_partition(node_id)
            began = self.catching_up.get(partition)
            if began is not None and beat.occurred_at >= began:
                del self.catching_up[partition]  # read up to what was sent since: the rest is silence again
        if self.owns(node_id):
            self.watched[node_id] = None
            self.watched.move_to_end(node_id)
        if was is NodeStatus.ALIVE and not self._due(record, now):
            return []
        return [self.state_of(node_id, now)]

    def _due(self, record: NodeRecord, now: datetime) -> bool:
        """Whether the node's state must go out again: what it says changed, or its refresh is due."""
        last, at = record.published, record.published_at
        if last is None or at is None or (now - at).total_seconds() >= self.refresh_s:
            return True
        inventory, telemetry = last
        if record.inventory is not inventory and record.inventory != inventory:
            return True
        if record.telemetry is telemetry:
            return False  # leases since the last publication said what it said
        memory = tuple(gpu.memory_bytes for gpu in record.heartbeat.gpus)
        return record.telemetry is not None and moved(record.telemetry, telemetry, memory, self.tolerance)

    def on_drain(self, drain: NodeDrain, now: datetime) -> list[Event]:
        """Mark or unmark a node as draining; its fresh state goes out at once. Unknown nodes and requests that
        change nothing (a redelivery, a second ``drain``) publish nothing."""
        record = self.nodes.get(drain.node_id)
        if record is None or record.draining == drain.draining:
            return []
        record.draining = drain.draining
        return [self.state_of(drain.node_id, now)]

    def restore(self, state: NodeState) -> None:
        """Rebuild from the compacted node-state topic; the next heartbeat or tick brings it up to date."""
        hb = Heartbeat(
            occurred_at=state.last_heartbeat_at,
            node_id=state.node_id,
            agent_instance=state.agent_instance,
            seq=state.last_beat_seq,  # a beat of this agent no newer than it was read already
            host=state.host,
            address=state.address,
            rendezvous_ports=state.rendezvous_ports,
            probe_port=state.probe_port,
            gpus=state.gpus,
            cpu_cores=state.cpu_cores,
            memory_bytes=state.memory_bytes,
            cpu_load=state.cpu_load,
            running=state.running,
            artifacts=state.artifacts,
            artifacts_absent=state.artifacts_absent,
            mounts=state.mounts,
            topology=state.topology,
            output_disk=state.output_disk,
        )
        self.nodes[state.node_id] = NodeRecord(hb, state.last_heartbeat_at, state.status, state.draining)
        self.ledger.reported(state.node_id, keys_of(state.running), state.occurred_at)
        self.watched.pop(state.node_id, None)
        if state.status is not NodeStatus.LOST and self.owns(state.node_id):
            self.watched[state.node_id] = None
            self._unordered = True

    def on_ledger_event(self, event: object, now: datetime | None = None) -> list[Event]:
        """Reserve or release GPUs; with ``now``, return the fresh state of each node whose reservations changed."""
        changed = self.apply_ledger(event)
        return [] if now is None else self.states_of(changed, now)

    def states_of(self, node_ids: Iterable[str], now: datetime) -> list[Event]:
        """The fresh states of those of ``node_ids`` this replica owns and knows, by node id."""
        return [self.state_of(n, now) for n in sorted(node_ids) if n in self.nodes and self.owns(n)]

    def apply_ledger(self, event: object) -> set[str]:
        """Reserve or release GPUs (see ``ledger``); the nodes whose reservations changed."""
        return self.ledger.apply(event)

    def alive(self, node_id: str) -> bool:
        record = self.nodes.get(node_id)
        return record is not None and record.status is NodeStatus.ALIVE

    def tick(self, now: datetime, *, blind: bool = False) -> list[Event]:
        """Passive transitions from silence of the nodes this replica owns: ALIVE -> SUSPECT -> LOST; then the
        orphaned reservations are released (every replica keeps its ledger so; the owner publishes the node).
        ``blind``: this replica cannot reach the broker now, so it reads nothing and judges nothing; once it can
        again, its nodes get the grace of a takeover, as after a pause."""
        last, self.last_tick = self.last_tick, now
        if blind:
            self.blind = True
            return []
        pause = self.pause_after_s
        paused = last is not None and pause is not None and (now - last).total_seconds() >= pause
        if paused or self.blind:
            self.blind = False
            self._grace(now)
            return []
        if self._unordered:
            self._watch_order()
        suspect_at = self.suspect_after_s - self.check_every_s
        lost_at = self.lost_after_s - self.check_every_s  # like suspicion: up to a check early, never late
        held = self._still_catching_up(now) if self.catching_up else frozenset()
        out: list[Event] = []
        gone: list[str] = []
        for node_id in self.watched:
            record = self.nodes[node_id]
            if (now - record.received_at).total_seconds() + MAX_TRANSIT_S < suspect_at:
                break  # this node's silence, and every later one's, is short of suspicion
            if held and heartbeat_partition(node_id) in held:
                continue  # its partition's newer heartbeats may still be unread
            silent = record.silence(now)
            if record.status is not NodeStatus.LOST and silent >= lost_at:
                record.status = NodeStatus.LOST
                self.ledger.drop_node(node_id)
                gone.append(node_id)
                out.append(self.state_of(node_id, now))
                out.append(
                    NodeLost(
                        occurred_at=now, node_id=node_id, last_heartbeat_at=record.received_at, silent_for_s=silent
                    )
                )
            elif record.status is NodeStatus.ALIVE and silent >= suspect_at + record.margin_s:
                record.status = NodeStatus.SUSPECT
                out.append(self.state_of(node_id, now))
        for node_id in gone:
            del self.watched[node_id]
        out.extend(self.states_of(self.ledger.release_orphans(now, self.alive), now))
        return out
