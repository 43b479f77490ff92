"""The agent's link prober against real probe endpoints on this host and a real broker: what a round measures,
where bursts go and where not, and what lands on the links topic."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.replay import replay
from shardyard.bus.topics import LINKS
from shardyard.clock import SystemClock
from shardyard.events import LinkMeasured, NodeStatus, RevocationReason, ShardRevocation
from shardyard.netprobe import ProbeServer
from shardyard.node_agent.links import LinkProber, ProbeSettings
from shardyard.training.slowdown import SLOWDOWN_DIR_ENV, LinkDelay
from tests.unit.builders import assignment, at, node_state

pytestmark = [pytest.mark.broker]

BURST = 64 * 1024


@pytest.fixture
async def endpoints() -> AsyncIterator[dict[str, ProbeServer]]:
    servers = {name: ProbeServer("127.0.0.1", 0) for name in ("node-b", "node-c", "node-d")}
    for server in servers.values():
        await server.start()
    yield servers
    for server in servers.values():
        await server.stop()


async def test_a_round_measures_gang_peers_and_the_sample_and_bursts_only_where_no_gang_syncs(
    bootstrap: str, endpoints: dict[str, ProbeServer]
) -> None:
    await ensure_topics(bootstrap)
    broker = make_broker(bootstrap, client_id="prober-test")
    await broker.start()
    running: set[str] = set()
    try:
        settings = ProbeSettings(sample=1, pings=4, burst_bytes=BURST, burst_every_s=3600)
        prober = LinkProber(
            "node-a", Bus(broker, service="node-agent"), SystemClock(), settings, running=lambda: running
        )
        for name, server in endpoints.items():
            prober.on_node_state(node_state(name, address="127.0.0.1", probe_port=server.port))
        prober.on_node_state(node_state("node-x", status=NodeStatus.LOST, probe_port=1))  # never probed
        prober.on_node_state(node_state("node-a", probe_port=2))  # itself: never probed

        # A gang of node-a and node-b forms: its link is measured at once, burst included.
        prober.on_assignment(assignment("job-1", 0, node_id="node-a"))
        prober.on_assignment(assignment("job-1", 1, node_id="node-b"))
        assert prober.owed()
        (formed,) = await prober.probe_owed()
        assert (formed.peer_id, formed.burst_bytes, formed.samples) == ("node-b", BURST, 4)
        assert formed.bandwidth_bytes_per_s is not None and formed.rtt_median_ms < 50
        assert not prober.owed()

        # The gang trains: its link gets pings only, marked shared; the sampled peer gets its first burst.
        running.add("job-1")
        first = {m.peer_id: m for m in await prober.probe_round()}
        assert set(first) == {"node-b", next(p for p in first if p != "node-b")} and len(first) == 2
        assert first["node-b"].burst_bytes == 0 and first["node-b"].shared_with_sync
        sampled = next(m for p, m in first.items() if p != "node-b")
        assert sampled.burst_bytes == BURST and not sampled.shared_with_sync

        # Over the next rounds the sample walks on; no peer gets a second burst within burst_every_s.
        later = [m for _ in range(3) for m in await prober.probe_round()]
        assert {m.peer_id for m in later} | set(first) == {"node-b", "node-c", "node-d"}
        assert all(m.burst_bytes == 0 for m in later if m.peer_id in first)

        # The job ends: node-b is no gang peer any more.
        prober.on_assignment(
            ShardRevocation(
                occurred_at=at(9),
                job_id="job-1",
                shard_index=0,
                attempt=1,
                node_id="node-a",
                term=1,
                reason=RevocationReason.JOB_SUCCEEDED,
                message="done",
            )
        )
        assert prober.gang_peers() == set()
        assert prober.counters.failed == 0 and prober.counters.events == 1 + 2 + len(later)
    finally:
        await broker.stop()

    published: list[LinkMeasured] = []
    await replay(bootstrap, [LINKS], lambda _topic, event: published.append(event))
    assert {(m.node_id, m.peer_id) for m in published} == {("node-a", p) for p in ("node-b", "node-c", "node-d")}
    assert endpoints["node-b"].requests >= 4 * 5


async def test_an_unreachable_peer_is_counted_and_measured_again_next_round(bootstrap: str) -> None:
    await ensure_topics(bootstrap)
    broker = make_broker(bootstrap, client_id="prober-test-2")
    await broker.start()
    try:
        settings = ProbeSettings(sample=4, pings=2, burst_bytes=0, timeout_s=0.5)
        prober = LinkProber("node-a", Bus(broker, service="node-agent"), SystemClock(), settings)
        closed = ProbeServer("127.0.0.1", 0)
        await closed.start()
        port = closed.port
        await closed.stop()  # nothing listens there now
        prober.on_node_state(node_state("node-b", address="127.0.0.1", probe_port=port))
        assert await prober.probe_round() == []
        assert prober.counters.failed == 1
        assert await prober.probe_round() == [] and prober.counters.failed == 2
    finally:
        await broker.stop()


async def test_a_node_sends_one_sampled_burst_an_interval_and_no_owed_probe_repeats(
    bootstrap: str, endpoints: dict[str, ProbeServer]
) -> None:
    """Whatever the sample brings, one burst a node per ``burst_every_s``; and a new gang's peers are probed once
    at once, bursts or not (with bursts off, they were probed every 0.25 s for ever)."""
    await ensure_topics(bootstrap)
    broker = make_broker(bootstrap, client_id="prober-test-3")
    await broker.start()
    try:
        bus = Bus(broker, service="node-agent")
        sampling = LinkProber("node-a", bus, SystemClock(), ProbeSettings(sample=3, pings=2, burst_bytes=BURST))
        no_bursts = LinkProber("node-a", bus, SystemClock(), ProbeSettings(sample=0, pings=2, burst_bytes=0))
        for prober in (sampling, no_bursts):
            for name, server in endpoints.items():
                prober.on_node_state(node_state(name, address="127.0.0.1", probe_port=server.port))
        measured = await sampling.probe_round()
        assert len(measured) == 3 and sum(1 for m in measured if m.burst_bytes) == 1
        assert not any(m.burst_bytes for m in await sampling.probe_round())

        no_bursts.on_assignment(assignment("job-2", 0, node_id="node-a"))
        no_bursts.on_assignment(assignment("job-2", 1, node_id="node-c"))
        (formed,) = await no_bursts.probe_owed()
        assert formed.peer_id == "node-c" and formed.burst_bytes == 0
        assert not no_bursts.owed()
    finally:
        await broker.stop()


async def test_the_slow_network_hook_slows_every_round_trip_of_its_node_only(
    bootstrap: str, endpoints: dict[str, ProbeServer], tmp_path: Path
) -> None:
    """The test-only hook (``shardyard.training.slowdown``): node-c's ``.link`` file makes its links that much
    slower a round trip as the prober measures them; the other links are as they are."""
    (tmp_path / "node-c.link").write_text("40")
    await ensure_topics(bootstrap)
    broker = make_broker(bootstrap, client_id="prober-test-4")
    await broker.start()
    try:
        settings = ProbeSettings(sample=3, pings=3, burst_bytes=0)
        delay = LinkDelay({SLOWDOWN_DIR_ENV: str(tmp_path), "SHARDYARD_NODE_ID": "node-a"})
        prober = LinkProber("node-a", Bus(broker, service="node-agent"), SystemClock(), settings, link_delay=delay)
        for name, server in endpoints.items():
            prober.on_node_state(node_state(name, address="127.0.0.1", probe_port=server.port))
        measured = {m.peer_id: m.rtt_median_ms for m in await prober.probe_round()}
    finally:
        await broker.stop()
    assert set(measured) == {"node-b", "node-c", "node-d"}
    assert measured["node-c"] >= 40 and measured["node-b"] < 40 and measured["node-d"] < 40
