"""The agent's link prober: it measures this node's links to a bounded set of peers and publishes what it found.

Every ``interval_s`` a round probes the nodes this one shares a gang with (read off the assignment topic, which
every agent reads whole) and ``sample`` others from its rotating sample (``shardyard.links.peers_to_probe``): O(k)
probes a node a round, however large the cluster. Each probe is ``pings`` round trips over one TCP connection to the
peer's probe endpoint (``shardyard.netprobe``), 9 bytes each way.

Throughput is measured with one burst of ``burst_bytes``: to every gang peer as soon as a gang is formed (before
its shards have loaded their model, so before its first sync), and otherwise at most one burst a node every
``burst_every_s``, to a sampled peer in no gang. No burst is sent on a link that carries a running gang of this
node's, nor to a peer in any gang: the burst would compete with their syncs. Pings still run there (they are 9
bytes), and those rounds say ``shared_with_sync``.

Peers come from the node-state topic (every agent reads it whole): the ALIVE nodes that advertise a probe port."""

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from shardyard.bus.kafka import Bus
from shardyard.clock import Clock
from shardyard.events import LinkMeasured, NodeState, NodeStatus, ShardAssignment, ShardRevocation
from shardyard.events.shard import RevocationReason
from shardyard.links import peers_to_probe
from shardyard.netprobe import ProbeClient, ProbeServer
from shardyard.service import Periodic
from shardyard.training.slowdown import LinkDelay

log = logging.getLogger(__name__)

ENDED = {RevocationReason.JOB_SUCCEEDED, RevocationReason.JOB_FAILED, RevocationReason.CANCELLED}


@dataclass(frozen=True)
class ProbeSettings:
    interval_s: float = 5.0
    sample: int = 8
    """Peers probed a round beyond this node's gang peers."""
    pings: int = 8
    burst_bytes: int = 4 * 1024 * 1024
    burst_every_s: float = 60.0
    timeout_s: float = 2.0
    concurrency: int = 4
    """Peers measured at once."""


@dataclass
class ProbeCounters:
    """What this agent's probing cost so far: rounds, probes, bytes sent and events published."""

    rounds: int = 0
    probes: int = 0
    failed: int = 0
    bytes_sent: int = 0
    events: int = 0


@dataclass
class LinkProber:
    node_id: str
    bus: Bus
    clock: Clock
    settings: ProbeSettings = field(default_factory=ProbeSettings)
    peers: dict[str, tuple[str, int]] = field(default_factory=dict)
    """node id -> (address, probe port) of the ALIVE nodes that can be probed."""
    gangs: dict[str, dict[int, str]] = field(default_factory=dict)
    """job id -> shard index -> node id, for every job with assignments (spares included)."""
    running: Callable[[], Iterable[str]] = tuple
    """The jobs with a live shard on this node (the agent's book): their links carry syncs."""
    counters: ProbeCounters = field(default_factory=ProbeCounters)
    link_delay: LinkDelay = field(default_factory=LinkDelay)
    """The test-only slow network hook (``shardyard.training.slowdown``): no delay in any real run."""
    _sampled_burst_at: float | None = None
    """When this node last sent a burst to a sampled peer (a new gang's bursts are not counted)."""
    _owed: set[str] = field(default_factory=set)
    """Gang peers owed a burst: their gang was formed since the last round."""
    _round: int = 0

    # -- what the bus says ---------------------------------------------------------------------------------------

    def on_node_state(self, state: NodeState) -> None:
        if state.node_id == self.node_id or state.status is not NodeStatus.ALIVE or state.probe_port is None:
            self.peers.pop(state.node_id, None)
            return
        self.peers[state.node_id] = (state.address, state.probe_port)

    def on_assignment(self, event: object) -> None:
        if isinstance(event, ShardRevocation) and event.reason in ENDED:
            self.gangs.pop(event.job_id, None)
            return
        if not isinstance(event, ShardAssignment):
            return
        members = self.gangs.setdefault(event.job_id, {})
        formed = members.get(event.shard_index) != event.node_id
        members[event.shard_index] = event.node_id
        if formed and self.node_id in members.values():
            self._owed.update(node for node in members.values() if node != self.node_id)

    def job_ended(self, job_id: str) -> None:
        self.gangs.pop(job_id, None)

    # -- what this node measures -----------------------------------------------------------------------------

    def gang_peers(self) -> set[str]:
        return self._peers_of(job for job, members in self.gangs.items() if self.node_id in members.values())

    def busy_peers(self) -> set[str]:
        return self._peers_of(job for job in self.running() if job in self.gangs)

    def _peers_of(self, jobs: Iterable[str]) -> set[str]:
        return {node for job in jobs for node in self.gangs[job].values() if node != self.node_id}

    def owed(self) -> bool:
        """Whether a gang formed since the last round: its links are measured at once (``probe_owed``)."""
        return bool(self._owed & self.peers.keys())

    async def probe_owed(self) -> list[LinkMeasured]:
        """Measure the links of the gangs formed since the last round, bursts included, before their first sync."""
        return await self._probe(sorted(self._owed & self.peers.keys()))

    async def probe_round(self) -> list[LinkMeasured]:
        """One round: this node's gang peers and ``sample`` more from its rotating sample."""
        self._round += 1
        self.counters.rounds += 1
        return await self._probe(
            peers_to_probe(self.node_id, self.peers, self.gang_peers(), self.settings.sample, self._round)
        )

    async def _probe(self, peers: list[str]) -> list[LinkMeasured]:
        """Measure ``peers`` (``concurrency`` at a time) and publish what was measured."""
        chosen = [p for p in peers if p in self.peers]
        busy = self.busy_peers()
        gate = asyncio.Semaphore(self.settings.concurrency)
        bursts = {}
        for peer in chosen:  # decided before any probe runs: the probes run side by side
            bursts[peer] = self._burst_due(peer, busy)
            if bursts[peer] and peer not in self._owed:
                self._sampled_burst_at = time.monotonic()  # this round's sampled burst: the next waits its interval

        async def one(peer: str) -> LinkMeasured | None:
            async with gate:
                return await self._measure(peer, peer in busy, bursts[peer])

        found = [m for m in await asyncio.gather(*(one(p) for p in chosen)) if m is not None]
        if found:
            try:
                await asyncio.wait_for(self.bus.publish_all(found), self.settings.timeout_s * 2)
                self.counters.events += len(found)
            except (TimeoutError, OSError, RuntimeError) as exc:
                log.warning(
                    "link measurements not published (they are perishable, the next round measures again): %s", exc
                )
        return found

    def _burst_due(self, peer: str, busy: set[str]) -> bool:
        """A new gang's peer gets its burst at once; another peer only when it is in no gang (its links may carry
        a sync) and this node sent no burst to anyone for ``burst_every_s``: one burst a node per interval, however
        many peers the rotating sample brings."""
        if self.settings.burst_bytes <= 0:
            return False
        if peer in self._owed:
            return True
        if peer in busy or any(peer in members.values() for members in self.gangs.values()):
            return False
        last = self._sampled_burst_at
        return last is None or time.monotonic() - last >= self.settings.burst_every_s

    async def _measure(self, peer: str, shared: bool, burst: bool) -> LinkMeasured | None:
        address, port = self.peers[peer]
        self.counters.probes += 1
        try:
            delay_s = self.link_delay.between(self.node_id, peer)
            async with ProbeClient(address, port, self.settings.timeout_s, delay_s) as client:
                trips = await client.round_trips(self.settings.pings)
                width = await client.burst(self.settings.burst_bytes, trips.median_ms) if burst else None
                self.counters.bytes_sent += client.bytes_out
        except (OSError, TimeoutError, ConnectionError, EOFError, asyncio.IncompleteReadError) as exc:
            self.counters.failed += 1
            self._owed.discard(peer)  # measured again by the rounds, not every 0.25 s
            log.info("probe of %s at %s:%d failed: %s", peer, address, port, exc)
            return None
        self._owed.discard(peer)
        return LinkMeasured(
            occurred_at=self.clock.now(),
            node_id=self.node_id,
            peer_id=peer,
            rtt_median_ms=trips.median_ms,
            rtt_p90_ms=trips.p90_ms,
            samples=len(trips.samples_ms),
            bandwidth_bytes_per_s=width,
            burst_bytes=self.settings.burst_bytes if burst else 0,
            shared_with_sync=shared,
        )


Probing = tuple[LinkProber | None, list[Periodic], ProbeServer | None]
"""The prober, its periodic work and the endpoint peers probe this node at (all empty when probing is off)."""


def probing_parts(prober: LinkProber, endpoint: socket.socket) -> Probing:
    """The prober's rounds, the quick check for newly formed gangs, and this node's probe endpoint."""

    async def round_() -> None:
        await prober.probe_round()

    async def owed() -> None:
        if prober.owed():
            await prober.probe_owed()

    rounds = Periodic("link-probe", prober.settings.interval_s, round_)
    formed = Periodic("link-probe-formed", 0.25, owed)  # a new gang's links, before its first sync
    host, port = endpoint.getsockname()[:2]
    return prober, [rounds, formed], ProbeServer(host, port, endpoint)
