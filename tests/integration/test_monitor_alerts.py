"""Alerts end to end on a real broker: two monitor replicas judge a node that goes SUSPECT and comes back. The alert
fires and resolves on the alerts topic, and both replicas show the same in /api/alerts and /metrics."""

import asyncio
import json
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shardyard.broker.ports import free_port
from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import ALERTS, DEADLETTER, SERVICES
from shardyard.events import AlertFiring, AlertResolved, AlertRule, NodeStatus, ServiceReady
from tests.support.events import Producer, Watcher, eventually
from tests.support.processes import service
from tests.unit.builders import node_state

pytestmark = pytest.mark.broker

NODE = "alerts-n1"


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


async def alerts_of(port: int) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(await asyncio.to_thread(get, f"http://127.0.0.1:{port}/api/alerts"))
    return answer


def of_node(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in alerts if (a["rule"], a["subject"]) == (AlertRule.NODE_SUSPECT, NODE)]


async def shows_firing(port: int) -> list[dict[str, Any]]:
    return of_node((await alerts_of(port))["firing"])


async def shows_resolved(port: int) -> bool:
    answer = await alerts_of(port)
    recent = of_node(answer["recent"])
    return not of_node(answer["firing"]) and bool(recent) and recent[0]["type"] == "alert.resolved"


async def test_a_suspect_node_fires_then_resolves_on_every_replica(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    ports = [free_port(), free_port()]
    monitors = [
        service(
            "shardyard.monitor",
            ["--http-port", str(port), "--instance", f"alerts-monitor-{i}"],
            bootstrap=bootstrap,
            log_dir=log_dir,
        )
        for i, port in enumerate(ports)
    ]
    with monitors[0], monitors[1]:
        async with Watcher(bootstrap, [SERVICES, ALERTS, DEADLETTER]) as watch, Producer(bootstrap) as send:
            await watch.until(lambda: len(watch.of(ServiceReady, service="monitor")) >= 2, timeout_s=60, what="both up")
            await send.raw(ALERTS.name, b"not an alert", key=b"junk")  # dead-lettered; the replicas read on

            silent_since = datetime.now(UTC) - timedelta(seconds=4)
            suspect = node_state(
                NODE, status=NodeStatus.SUSPECT, occurred_at=datetime.now(UTC), last_heartbeat_at=silent_since
            )
            await send.event(suspect)
            fired = await watch.first(AlertFiring, rule=AlertRule.NODE_SUSPECT, subject=NODE, timeout_s=30)
            assert fired.since == silent_since and "SUSPECT" in fired.summary
            for port in ports:
                (shown,) = await eventually(lambda port=port: shows_firing(port), f"the alert firing on :{port}")
                assert datetime.fromisoformat(shown["since"]) == fired.since

            now = datetime.now(UTC)
            await send.event(node_state(NODE, occurred_at=now, last_heartbeat_at=now))
            resolved = await watch.first(AlertResolved, rule=AlertRule.NODE_SUSPECT, subject=NODE, timeout_s=30)
            assert resolved.since == fired.since
            for port in ports:
                await eventually(lambda port=port: shows_resolved(port), f"the alert resolved on :{port}")
                metrics = (await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics")).decode().splitlines()
                assert 'shardyard_alerts_firing{rule="NODE_SUSPECT"} 0.0' in metrics

            # A replica publishes a transition only if its view has not seen it; two deciding within the same few
            # milliseconds may both publish it, and such duplicates carry one event id (`since` is the data's).
            assert {e.event_id for e in watch.of(AlertFiring, rule=AlertRule.NODE_SUSPECT, subject=NODE)} == {
                fired.event_id
            }
            assert any(t == DEADLETTER.name and v == b"not an alert" for t, v, _ in watch.raw)
