"""The embedded broker's CPU under a constant load, as its log grows (prints JSON).

One embedded broker; ``scale_nodes.py`` heartbeats ``--nodes`` simulated nodes at 1 Hz into it (as in
``bench/scale.py``), and ``--readers`` consumers read the heartbeats topic at its end, as the resource-pool and
monitor replicas do. Nothing else runs. Every ``--every-s`` the broker's CPU over that interval is sampled: with a
constant load, a flat series means its cost follows the traffic; a rising one, that it follows what it stores.

    python bench/broker_growth.py [--nodes 1000] [--readers 4] [--samples 8] [--every-s 15]
"""

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from shardyard.broker.embedded import EmbeddedBroker
from shardyard.bus.admin import ensure_topics
from shardyard.bus.quirks import fetch_wait_ms
from shardyard.bus.topics import HEARTBEATS

NODES_SCRIPT = Path(__file__).with_name("scale_nodes.py")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def read_the_end(bootstrap: str) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, fetch_max_wait_ms=fetch_wait_ms())
    await consumer.start()
    try:
        await consumer.topics()
        partitions = [TopicPartition(HEARTBEATS.name, p) for p in range(HEARTBEATS.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_end(*partitions)
        while True:
            await consumer.getmany(timeout_ms=1000)
    finally:
        await consumer.stop()


async def sample(args: argparse.Namespace, broker: EmbeddedBroker) -> list[dict[str, float]]:
    """The broker's CPU every ``--every-s`` while the readers read."""
    assert broker.pid is not None
    readers = [asyncio.create_task(read_the_end(broker.bootstrap)) for _ in range(args.readers)]
    try:
        began = time.monotonic()
        samples = []
        for _ in range(args.samples):
            used, at = cpu_seconds(broker.pid), time.monotonic()
            await asyncio.sleep(args.every_s)
            share = 100 * (cpu_seconds(broker.pid) - used) / (time.monotonic() - at)
            samples.append({"at_s": round(time.monotonic() - began, 1), "broker_cpu_percent": round(share, 1)})
            print(f"[broker-growth] {samples[-1]}", file=sys.stderr, flush=True)
        return samples
    finally:
        for task in readers:
            task.cancel()
        for task in readers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--every-s", type=float, default=15.0)
    args = parser.parse_args()
    broker = EmbeddedBroker().start()
    nodes: subprocess.Popen[bytes] | None = None
    try:
        asyncio.run(ensure_topics(broker.bootstrap))
        argv = [sys.executable, str(NODES_SCRIPT), "--bootstrap", broker.bootstrap, "--nodes", str(args.nodes)]
        limit = str(args.samples * args.every_s + 60)
        nodes = subprocess.Popen(
            [*argv, "--max-s", limit], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        samples = asyncio.run(sample(args, broker))
    finally:
        if nodes is not None:
            nodes.kill()
            nodes.wait(10)
        broker.stop()
    result = {"benchmark": "broker_growth", "nodes": args.nodes, "readers": args.readers, "samples": samples}
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
