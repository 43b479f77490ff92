"""The broker's CPU and memory under a constant load, as its log grows (prints JSON).

One broker (the local Apache Kafka, or ``--broker embedded``, the fallback); ``scale_nodes.py`` heartbeats
``--nodes`` simulated nodes at 1 Hz into it (as in ``bench/scale.py``), and ``--readers`` consumers read the
heartbeats topic at its end, as the resource-pool and monitor replicas do. Nothing else runs. Every ``--every-s`` the
broker's CPU over that interval and its resident memory are sampled: with a constant load, flat series mean its
cost follows the traffic; rising ones, that it follows what it stores (Tansu 0.6's ``memory://`` log does).

    python bench/broker_growth.py [--broker kafka|embedded] [--nodes 1000] [--readers 4] [--samples 8] [--every-s 15]
    python bench/broker_growth.py --smoke
"""

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from scale_bus import cpu_seconds, rss_mib
from shardyard.broker.embedded import EmbeddedBroker
from shardyard.broker.install import find_install
from shardyard.broker.kafka import LocalKafka
from shardyard.broker.process import BrokerProcess
from shardyard.bus.address import BROKER_ENV
from shardyard.bus.admin import ensure_topics
from shardyard.bus.quirks import fetch_wait_ms
from shardyard.bus.topics import HEARTBEATS
from smoke import parse_args

NODES_SCRIPT = Path(__file__).with_name("scale_nodes.py")


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


async def sample(args: argparse.Namespace, broker: BrokerProcess) -> list[dict[str, float | None]]:
    """The broker's CPU and resident memory every ``--every-s`` while the readers read."""
    pid = broker.pid
    assert pid is not None
    readers = [asyncio.create_task(read_the_end(broker.bootstrap)) for _ in range(args.readers)]
    try:
        began = time.monotonic()
        samples: list[dict[str, float | None]] = []
        for _ in range(args.samples):
            used, at = cpu_seconds(pid) or 0.0, time.monotonic()
            await asyncio.sleep(args.every_s)  # the sampling period: a measurement interval, not a wait for a state
            share = 100 * ((cpu_seconds(pid) or 0.0) - used) / (time.monotonic() - at)
            samples.append(
                {
                    "at_s": round(time.monotonic() - began, 1),
                    "broker_cpu_percent": round(share, 1),
                    "broker_rss_mib": rss_mib(pid),
                }
            )
            print(f"[broker-growth] {samples[-1]}", file=sys.stderr, flush=True)
        return samples
    finally:
        for task in readers:
            task.cancel()
        for task in readers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def growth(samples: list[dict[str, float | None]], key: str) -> float | None:
    """The last half's mean over the first half's (1.0: flat)."""
    values = [float(s[key]) for s in samples if s[key] is not None]
    half = len(values) // 2
    if half == 0 or not sum(values[:half]):
        return None
    return round((sum(values[-half:]) / half) / (sum(values[:half]) / half), 3)


def start(kind: str, folder: Path) -> BrokerProcess:
    if kind == "embedded":
        return EmbeddedBroker().start()
    install, why = find_install()
    if install is None:
        raise SystemExit(f"no local Apache Kafka: {why} (./dev setup installs it; or --broker embedded)")
    return LocalKafka(install=install, folder=folder).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", choices=("kafka", "embedded"), default="kafka")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--every-s", type=float, default=15.0)
    args = parse_args(parser, {"nodes": 20, "readers": 1, "samples": 2, "every_s": 2.0})
    os.environ[BROKER_ENV] = args.broker  # the fetch waits of this process's and the simulator's consumers
    nodes: subprocess.Popen[bytes] | None = None
    with tempfile.TemporaryDirectory(prefix="shardyard-broker-growth-") as tmp:
        broker = start(args.broker, Path(tmp))
        try:
            asyncio.run(ensure_topics(broker.bootstrap))
            argv = [sys.executable, str(NODES_SCRIPT), "--bootstrap", broker.bootstrap, "--nodes", str(args.nodes)]
            argv += ["--data-root", tmp]
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
    result = {
        "benchmark": "broker_growth",
        "broker": args.broker,
        "nodes": args.nodes,
        "readers": args.readers,
        "samples": samples,
        "cpu_growth_last_half_vs_first": growth(samples, "broker_cpu_percent"),
        "rss_growth_last_half_vs_first": growth(samples, "broker_rss_mib"),
    }
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
