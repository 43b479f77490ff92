"""Heartbeats become node state; silence makes a node SUSPECT, then LOST with a node-lost event."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import FAILURES, NODE_STATE, SERVICES
from shardyard.events import GpuStatus, Heartbeat, NodeLost, NodeState, NodeStatus, ServiceReady
from tests.support.events import Producer, Watcher
from tests.support.processes import service

pytestmark = pytest.mark.broker


def heartbeat(node_id: str, seq: int) -> Heartbeat:
    return Heartbeat(
        occurred_at=datetime.now(UTC),
        node_id=node_id,
        agent_instance="agent-1",
        seq=seq,
        host="test",
        address="127.0.0.1",
        rendezvous_ports=(30000, 10),
        gpus=(GpuStatus(index=0, model="A100", tflops=35, memory_bytes=80 * 1024**3, simulated=True),),
        cpu_cores=16,
        memory_bytes=128 * 1024**3,
        cpu_load=0.1,
    )


async def test_liveness(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    args = ["--suspect-after-s", "1", "--lost-after-s", "2.5"]
    with service("shardyard.resource_pool", args, bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [NODE_STATE, FAILURES, SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="resource-pool", timeout_s=60)
            await send.event(heartbeat("pool-n1", 1))
            alive = await watch.first(NodeState, node_id="pool-n1", status=NodeStatus.ALIVE)
            assert alive.gpus[0].model == "A100"
            await watch.first(NodeState, node_id="pool-n1", status=NodeStatus.SUSPECT, timeout_s=10)
            await watch.first(NodeState, node_id="pool-n1", status=NodeStatus.LOST, timeout_s=10)
            lost = await watch.first(NodeLost, node_id="pool-n1")
            assert lost.silent_for_s >= 2.5
            await send.event(heartbeat("pool-n1", 2))
            await watch.until(
                lambda: watch.of(NodeState, node_id="pool-n1")[-1].status is NodeStatus.ALIVE, what="ALIVE again"
            )
            assert len(watch.of(NodeLost, node_id="pool-n1")) == 1
