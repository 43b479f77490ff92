"""Measured links on a real broker: link measurements of four nodes, one of them behind a 20 ms link while the rest
see 0.3 ms, reach a monitor process through the links topic. It shows them at ``/api/links`` and ``/metrics``, fires
SLOW_LINK for each of that node's links, and its dashboard shows a job's gang links with the slow one marked."""

import asyncio
import json
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shardyard.broker.ports import free_port
from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import ALERTS, SERVICES
from shardyard.events import AlertFiring, AlertRule, JobAccepted, JobReady, JobRunning, LinkMeasured, ServiceReady
from tests.support.browser import Dom, browser, render
from tests.support.events import Producer, Watcher, eventually
from tests.support.processes import service
from tests.unit.builders import job_spec, node_state, scheduled

pytestmark = pytest.mark.broker
RUN = uuid.uuid4().hex[:6]
"""Ids unique to this run: an outside broker (``SHARDYARD_KAFKA_BOOTSTRAP``) keeps earlier runs' events."""
NODES = tuple(f"links-{RUN}-n{i}" for i in range(1, 5))
SLOW_NODE = NODES[3]
SLOW_MS, FAST_MS = 20.0, 0.3
SLOW_LINKS = sorted(f"{a}|{SLOW_NODE}" for a in NODES[:3])
JOB = f"links-job-{RUN}"


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


async def get_json(url: str) -> Any:
    return json.loads(await asyncio.to_thread(get, url))


async def publish_cluster(send: Producer) -> None:
    """The four nodes' states, and every node's probe of every other: SLOW_NODE's links 20 ms, the rest 0.3 ms."""
    now = datetime.now(UTC)
    for node in NODES:
        await send.event(node_state(node, occurred_at=now, last_heartbeat_at=now, topology={"zone": "z1"}))
    for a in NODES:
        for b in NODES:
            if a != b:
                ms = SLOW_MS if SLOW_NODE in (a, b) else FAST_MS
                await send.event(
                    LinkMeasured(
                        occurred_at=now,
                        node_id=a,
                        peer_id=b,
                        rtt_median_ms=ms,
                        rtt_p90_ms=ms * 1.1,
                        samples=20,
                        bandwidth_bytes_per_s=1.2e9,
                        burst_bytes=4 << 20,
                    )
                )


def monitor(port: int, bootstrap: str, log_dir: Path) -> Any:
    flags = ["--http-port", str(port), "--instance", f"links-monitor-{port}", "--alert-slow-link-for-s", "2"]
    return service("shardyard.monitor", flags, bootstrap=bootstrap, log_dir=log_dir)


async def test_slow_links_show_in_the_api_and_metrics_and_fire_slow_link(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with monitor(port, bootstrap, log_dir):
        async with Watcher(bootstrap, [SERVICES, ALERTS]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="monitor", timeout_s=60)
            await publish_cluster(send)

            async def all_links() -> dict[str, Any] | None:
                answer: dict[str, Any] = await get_json(f"{base}/api/links")
                ours = [link for link in answer["links"] if link["a"] in NODES and link["source"] == "measured"]
                return answer if len(ours) == 6 else None

            answer = await eventually(all_links, "the six links of the four nodes at /api/links")
            ours = [link for link in answer["links"] if link["a"] in NODES]
            assert sorted(f"{link['a']}|{link['b']}" for link in ours if link["slow"]) == SLOW_LINKS
            first = ours[0]  # worst first
            assert (first["b"], first["rtt_ms"], first["bandwidth_bytes_per_s"], first["why"]) == (
                SLOW_NODE,
                SLOW_MS,
                1.2e9,
                "RTT 20.0 ms, the cluster's 0.30 ms",
            )
            assert set(NODES) <= set(answer["nodes"])

            fired = await watch.until(
                lambda: sorted(a.subject for a in watch.of(AlertFiring, rule=AlertRule.SLOW_LINK)) == SLOW_LINKS,
                timeout_s=30,
                what="SLOW_LINK firing for each of the slow node's links",
            )
            assert fired
            for alert in watch.of(AlertFiring, rule=AlertRule.SLOW_LINK):
                a, b = alert.subject.split("|")
                assert alert.summary == f"the link between {a} and {b} is slow: RTT 20.0 ms, the cluster's 0.30 ms"

            text = (await asyncio.to_thread(get, f"{base}/metrics")).decode().splitlines()
            a, b = NODES[0], SLOW_NODE
            assert f'shardyard_node_rtt_seconds{{node="{a}",peer="{b}",source="measured"}} 0.02' in text
            assert f'shardyard_link_bandwidth_bytes_per_second{{node="{a}",peer="{b}"}} 1.2e+09' in text
            assert f'shardyard_link_slow{{node="{a}",peer="{b}"}} 1.0' in text
            assert any(line.startswith(f'shardyard_node_mean_rtt_seconds{{node="{b}",') for line in text)


@pytest.mark.slow
async def test_the_dashboard_shows_a_jobs_gang_links(bootstrap: str, log_dir: Path, tmp_path: Path) -> None:
    browser()  # fail at once, before the broker work, when there is no browser
    await ensure_topics(bootstrap)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with monitor(port, bootstrap, log_dir):
        async with Watcher(bootstrap, [SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="monitor", timeout_s=60)
            await publish_cluster(send)
            now, spec = datetime.now(UTC), job_spec(job_id=JOB, gpu_count=3)
            for event in (
                JobAccepted(occurred_at=now, job_id=JOB, spec=spec, source_offset=f"links/0/{RUN}"),
                JobReady(occurred_at=now, job_id=JOB, spec=spec),
                scheduled(JOB, NODES[0], NODES[1], SLOW_NODE, occurred_at=now),
                JobRunning(occurred_at=now, job_id=JOB, attempt=1),
            ):
                await send.event(event)

            async def gang_links() -> list[dict[str, Any]] | None:
                links: list[dict[str, Any]] = (await get_json(f"{base}/api/jobs/{JOB}"))["links"]
                return links if sum(1 for link in links if link["slow"]) == 2 else None

            links = await eventually(gang_links, f"{JOB}'s gang links, two of them slow")
            assert [link["source"] for link in links] == ["measured"] * 3

            dom = Dom(render(f"{base}/#job={JOB}", "--dump-dom", tmp_path / "profile"))
            rows = {row["data-link"]: row for row in dom.find("tr", inside="gang-links") if "data-link" in row}
            assert set(rows) == {f"{NODES[0]}|{NODES[1]}", f"{NODES[0]}|{SLOW_NODE}", f"{NODES[1]}|{SLOW_NODE}"}
            assert rows[f"{NODES[0]}|{SLOW_NODE}"]["class"] == "slow-link"
            assert rows[f"{NODES[0]}|{NODES[1]}"]["class"] == ""
            assert "gang links" in dom.all_text() and "RTT 20.0 ms, the cluster's 0.30 ms" in dom.all_text()
