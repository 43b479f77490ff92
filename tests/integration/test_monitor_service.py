"""The monitor folds every topic into its status API and /metrics."""

import asyncio
import json
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shardyard.bus.admin import ensure_topics
from shardyard.bus.topics import SERVICES
from shardyard.embedded import free_port
from shardyard.events import JobRejected, RejectReason, ServiceReady
from tests.support.events import Producer, Watcher
from tests.support.processes import service

pytestmark = pytest.mark.broker


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


async def test_status_api_and_metrics(bootstrap: str, log_dir: Path) -> None:
    await ensure_topics(bootstrap)
    port = free_port()
    with service("shardyard.monitor", ["--http-port", str(port)], bootstrap=bootstrap, log_dir=log_dir):
        async with Watcher(bootstrap, [SERVICES]) as watch, Producer(bootstrap) as send:
            await watch.first(ServiceReady, service="monitor", timeout_s=60)
            await send.event(
                JobRejected(
                    occurred_at=datetime.now(UTC),
                    job_id="mon-bad",
                    reason=RejectReason.WRONG_TYPE,
                    message="invalid submission: resource_requirements.gpu.count: Input should be a valid integer",
                    source_offset="t/0/0",
                )
            )
            base = f"http://127.0.0.1:{port}"

            async def rejected_visible() -> dict[str, object]:
                for _ in range(200):
                    try:
                        return dict(json.loads(await asyncio.to_thread(get, f"{base}/api/jobs/mon-bad")))
                    except OSError:
                        await asyncio.sleep(0.05)
                raise AssertionError("the monitor never showed the rejected job")

            job = await rejected_visible()
            assert job["state"] == "REJECTED" and job["reason"] == "WRONG_TYPE"
            metrics = (await asyncio.to_thread(get, f"{base}/metrics")).decode()
            assert 'shardyard_jobs{state="REJECTED"} 1.0' in metrics
            services = json.loads(await asyncio.to_thread(get, f"{base}/api/services"))
            assert any(s["service"] == "monitor" for s in services["services"])
