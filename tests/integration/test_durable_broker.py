"""The embedded broker on ``s3://`` storage keeps its log across a restart (``SHARDYARD_BROKER_STORAGE``): over
``s3rver`` (npm, a file-backed S3 server), the one S3-compatible server from the package registries this build's
Tansu worked with here. Skips where ``s3rver`` is not installed (``npm install -g s3rver``); ``./dev`` does not
install it, since it is not the default (see docs/operators/running.md: "What the embedded broker keeps across a
restart")."""

import asyncio
import json
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardyard.broker.embedded import EmbeddedBroker
from shardyard.broker.ports import free_port, wait_for_port
from shardyard.bus.admin import ensure_topics
from shardyard.bus.assigned import assigned_consumer
from shardyard.bus.topics import SUBMISSIONS
from shardyard.cli import client
from tests.support.wait import until

EXAMPLE = Path(client.__file__).with_name("example_job.json")
pytestmark = [pytest.mark.broker, pytest.mark.skipif(shutil.which("s3rver") is None, reason="s3rver is not installed")]


@pytest.fixture
def object_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen(
        ["s3rver", "-d", str(tmp_path / "s3"), "-p", str(port), "--configure-bucket", "tansu", "--silent"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        assert wait_for_port("127.0.0.1", port, 15), "s3rver did not listen"
        for name, value in {
            "AWS_ENDPOINT": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "S3RVER",
            "AWS_SECRET_ACCESS_KEY": "S3RVER",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }.items():
            monkeypatch.setenv(name, value)
        yield "s3://tansu/"
    finally:
        server.kill()
        server.wait()


def submitted(bootstrap: str) -> list[str]:
    """The task ids of the submissions topic's records (raw user JSON), read without a group."""

    async def read() -> list[str]:
        consumer, _ = await assigned_consumer(bootstrap, [SUBMISSIONS], fetch_max_wait_ms=100)
        try:
            batches = await consumer.getmany(timeout_ms=2000)
        finally:
            await consumer.stop()
        return [json.loads(r.value or b"{}")["task_id"] for records in batches.values() for r in records]

    return asyncio.run(read())


def test_a_restarted_broker_on_s3_storage_serves_what_it_held(object_store: str, tmp_path: Path) -> None:
    example = json.loads(EXAMPLE.read_text())
    port = free_port()
    with EmbeddedBroker(port=port, storage=object_store, log_path=tmp_path / "broker.log") as broker:
        assert broker.durable
        asyncio.run(ensure_topics(broker.bootstrap))
        for i in range(3):
            client.submit(broker.bootstrap, json.dumps(example | {"task_id": f"durable-{i}"}).encode())
        until(lambda: len(submitted(broker.bootstrap)) == 3 or None, "three submissions", 20)
    with socket.socket() as probe:  # the port is free again: the restart takes it
        probe.bind(("127.0.0.1", port))
    with EmbeddedBroker(port=port, storage=object_store, log_path=tmp_path / "broker.log") as again:
        held = until(lambda: sorted(submitted(again.bootstrap)) or None, "the submissions after the restart", 20)
        assert held == ["durable-0", "durable-1", "durable-2"]
    assert (tmp_path / "s3" / "tansu").is_dir()
