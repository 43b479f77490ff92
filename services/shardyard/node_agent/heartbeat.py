"""The agent's heartbeat and the lease it renews. One beat at a time, numbered in the order it is published: the
full heartbeat or its lease (:mod:`.beats`). A beat the bus acknowledged renews the lease, and the lease file the
node's shards watch; once no beat went out for ``lease_s`` the lease is lost and the agent fences itself
(:mod:`.fencing`). A delivered beat also lets out what the outbox kept while the bus was gone.

Each beat carries the agent's stalls (``shardyard.liveness``): its event loop's worst lag since the last beat, and the
margin its worst stall of the last minute (that lag, or the broker's wait to acknowledge a beat) asks for. The pool
suspects the node that much later, and the shards' lease file is renewed with the same margin."""

import asyncio
import socket
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path

from shardyard.clock import Clock
from shardyard.events import DiskSpace, GpuStatus, Heartbeat, RunningShard
from shardyard.liveness import LoopLag, Stalls, margin_s
from shardyard.node_agent.artifacts import ArtifactWatch
from shardyard.node_agent.beats import Beats
from shardyard.node_agent.fencing import fence_message, lease_expired
from shardyard.node_agent.identity import NodeIdentity
from shardyard.node_agent.outbox import Outbox
from shardyard.training.lease import renew


def heartbeat_of(
    me: NodeIdentity,
    *,
    seq: int,
    now: datetime,
    gpus: tuple[GpuStatus, ...],
    cpu_load: float,
    running: tuple[RunningShard, ...],
    watch: ArtifactWatch,
    output_disk: DiskSpace | None = None,
) -> Heartbeat:
    """What the node says of itself at beat ``seq``: who, where, its GPUs, load, shards, artifacts and the free
    space of its output disk."""
    return Heartbeat(
        occurred_at=now,
        node_id=me.node_id,
        agent_instance=me.instance,
        seq=seq,
        host=socket.gethostname(),
        address=me.address,
        rendezvous_ports=me.rendezvous_ports,
        probe_port=me.probe_port,
        gpus=gpus,
        cpu_cores=me.cpu_cores,
        memory_bytes=me.memory_bytes,
        cpu_load=round(cpu_load, 4),
        mounts=dict(me.mounts),
        running=running,
        artifacts=watch.report(),
        topology=dict(me.topology),
        artifact_errors=watch.report_errors(),
        artifacts_absent=watch.report_absent(),
        output_disk=output_disk,
    )


class Heartbeats:
    def __init__(
        self, outbox: Outbox, clock: Clock, *, lease_s: float, refresh_s: float, lease_file: str | None
    ) -> None:
        self.outbox = outbox
        self.clock = clock
        self.lease_s = lease_s
        self.lease_file = lease_file
        self.seq = 0
        self.beats = Beats(refresh_s=refresh_s)
        """Full heartbeat or lease, beat by beat."""
        self.bus_ok_at = clock.monotonic()
        """When a heartbeat last reached the bus (monotonic seconds): the lease runs from here."""
        self.loop_lag = LoopLag()
        """Started with the agent's periodic work; a beat takes its worst since the last one."""
        self.stalls = Stalls()
        self.margin_s = 0.0
        """The margin of the last beat sent: what the shards' lease is renewed with."""
        self._lock = asyncio.Lock()  # one heartbeat at a time: seq order is publish order

    def start_lease(self) -> None:
        """The lease runs from now (start-up: before the first heartbeat, the agent has not lost anything)."""
        self.bus_ok_at = self.clock.monotonic()
        self._renew_shard_lease()

    def lease_lost(self) -> str | None:
        """Why the shards must stop, once no heartbeat reached the bus for ``lease_s``; None while the lease holds."""
        now = self.clock.monotonic()
        if not lease_expired(now, self.bus_ok_at, self.lease_s):
            return None
        return fence_message(now - self.bus_ok_at)

    async def send(self, status: Callable[[int], Awaitable[Heartbeat]]) -> None:
        """Publish the next beat: ``status(seq)`` says what the node is; the beat is it in full, or its lease."""
        async with self._lock:
            heartbeat = await status(self.seq + 1)
            self.seq += 1
            sent = self.clock.monotonic()
            lag = self.loop_lag.take()
            self.stalls.add(sent, lag)
            self.margin_s = margin_s(self.stalls.worst(sent))
            heartbeat = heartbeat.model_copy(update={"loop_lag_s": round(lag, 4), "margin_s": self.margin_s})
            beat = self.beats.next(heartbeat, sent)
            delivered = await self.outbox.publish(beat)
            self.stalls.add(sent, self.clock.monotonic() - sent)  # the broker's wait: a stall the next beat tells
            if delivered:  # the lease runs from the sending: the pool may have heard of us no later than that
                self.beats.delivered(beat, sent)
                self.bus_ok_at = max(self.bus_ok_at, sent)
                self._renew_shard_lease()
        if delivered and self.outbox.pending:
            await self.outbox.flush()

    def _renew_shard_lease(self) -> None:
        """Keep this agent's shards alive: they fence themselves when the lease file ages (agent paused or cut off)."""
        if self.lease_file is not None:
            Path(self.lease_file).parent.mkdir(parents=True, exist_ok=True)
            renew(self.lease_file, self.margin_s)
