"""``shardyard cancel`` and ``shardyard drain`` against the real queue, resource pool and monitor on a real broker."""

import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shardyard.broker.ports import free_port
from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import LIFECYCLE, NODE_STATE, SERVICES, SUBMISSIONS
from shardyard.cli import client, main
from shardyard.cli.cluster import ClusterInfo
from shardyard.events import GpuStatus, Heartbeat, JobCancelled, JobReady, JobWaiting, NodeState, ServiceReady
from tests.support.events import Producer, Watcher, dumps
from tests.support.processes import service

pytestmark = pytest.mark.broker
EXAMPLE = json.loads((Path(__file__).parents[2] / "examples" / "fine_tune_gpt2.json").read_text())


def job(task_id: str, **fields: Any) -> bytes:
    return dumps({**EXAMPLE, "task_id": task_id, **fields})


def heartbeat(node_id: str) -> Heartbeat:
    return Heartbeat(
        occurred_at=datetime.now(UTC),
        node_id=node_id,
        agent_instance="agent-1",
        seq=1,
        host="test",
        address="127.0.0.1",
        rendezvous_ports=(30000, 10),
        gpus=(GpuStatus(index=0, model="A100", tflops=35, memory_bytes=80 * 1024**3, simulated=True),),
        cpu_cores=16,
        memory_bytes=128 * 1024**3,
        cpu_load=0.1,
    )


async def shardyard(run_dir: Path, *argv: str) -> int:
    """The CLI, in a thread: it runs its own event loop."""
    return await asyncio.to_thread(main.main, ["--run-dir", str(run_dir), *argv])


async def test_cancel_and_drain(
    bootstrap: str, log_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await ensure_topics(bootstrap)
    port = free_port()
    monitor_url = f"http://127.0.0.1:{port}"
    ClusterInfo(str(tmp_path), bootstrap, monitor_url, str(tmp_path / "data"), False, time.time()).save()
    with (
        service("shardyard.queue", [], bootstrap=bootstrap, log_dir=log_dir),
        service("shardyard.resource_pool", [], bootstrap=bootstrap, log_dir=log_dir),
        service("shardyard.monitor", ["--http-port", str(port)], bootstrap=bootstrap, log_dir=log_dir),
    ):
        async with Watcher(bootstrap, [LIFECYCLE, NODE_STATE, SERVICES]) as watch, Producer(bootstrap) as send:
            for name in ("queue", "resource-pool", "monitor"):
                await watch.first(ServiceReady, service=name, timeout_s=90)

            # cancel: a job held for its parent is cancelled by the queue; the CLI waits for the monitor to say so
            await send.raw(SUBMISSIONS.name, job("cli-parent"), key=b"cli-parent")
            await watch.first(JobReady, job_id="cli-parent")
            await send.raw(SUBMISSIONS.name, job("cli-child", depends_on=["cli-parent"]), key=b"cli-child")
            await watch.first(JobWaiting, job_id="cli-child")
            await watch.until(lambda: client.job(monitor_url, "cli-child"), what="the monitor to show cli-child")
            capsys.readouterr()

            assert await shardyard(tmp_path, "cancel", "cli-child", "--wait", "--timeout", "30") == 0

            assert "job cli-child cancelled" in capsys.readouterr().out
            cancelled = await watch.first(JobCancelled, job_id="cli-child")
            assert "cli" in cancelled.message
            assert await shardyard(tmp_path, "cancel", "cli-child") == 1
            assert "already ended CANCELLED" in capsys.readouterr().err
            assert await shardyard(tmp_path, "cancel", "cli-nobody") == 1
            assert "no job 'cli-nobody'" in capsys.readouterr().err

            # drain: the pool marks the node at once, the monitor shows it, `shardyard nodes` marks it
            await send.event(heartbeat("cli-n1"))
            await watch.until(lambda: client.node(monitor_url, "cli-n1"), what="the monitor to show cli-n1")

            assert await shardyard(tmp_path, "drain", "cli-n1", "--wait", "--timeout", "30") == 0

            await watch.first(NodeState, node_id="cli-n1", draining=True)
            capsys.readouterr()
            assert await shardyard(tmp_path, "nodes") == 0
            (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("cli-n1")]
            assert row.split()[2] == "DRAIN"  # after the status, which may be SUSPECT by now: one heartbeat only
            assert await shardyard(tmp_path, "drain", "cli-n1", "--undo", "--wait", "--timeout", "30") == 0
            assert await shardyard(tmp_path, "drain", "cli-ghost") == 1
            assert "no node 'cli-ghost'" in capsys.readouterr().err
        assert len(watch.of(JobCancelled, job_id="cli-child")) == 1
