"""The monitor's overhead while many nodes heartbeat (prints JSON).

An embedded broker, a resource pool (which turns heartbeats into node states, as in production) and one monitor run as
real processes; this process publishes a heartbeat for each of ``--nodes`` simulated nodes (8 GPUs each) every second.
After a warm-up, the monitor's CPU time and resident memory are sampled from ``/proc`` over ``--seconds``; its status
API and ``/metrics`` are read once a second meanwhile, as a dashboard would.

    python bench/monitor.py [--nodes 1000] [--seconds 30]
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from shardyard.bus.admin import ensure_topics
from shardyard.bus.codec import encode, key_of, topic_of
from shardyard.embedded import EmbeddedBroker, free_port
from shardyard.events import GpuStatus, Heartbeat

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def heartbeat(node: int, seq: int) -> Heartbeat:
    return Heartbeat(
        occurred_at=datetime.now(UTC),
        node_id=f"sim-{node:05d}",
        agent_instance=f"sim-{node:05d}-1",
        seq=seq,
        host=f"sim-{node:05d}",
        address=f"10.{node // 65536}.{node // 256 % 256}.{node % 256}",
        rendezvous_ports=(29500, 16),
        gpus=tuple(
            GpuStatus(index=i, model="A100", tflops=35.0, memory_bytes=80 * 1024**3, utilization=0.5, temperature_c=60)
            for i in range(8)
        ),
        cpu_cores=64,
        memory_bytes=512 * 1024**3,
        cpu_load=0.2,
    )


async def beat(bootstrap: str, nodes: int, until: float) -> int:
    """Every node heartbeats once a second (spread over the second); returns how many heartbeats were sent."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=5)
    await producer.start()
    sent, seq = 0, 0
    try:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while time.monotonic() < until:
            seq += 1
            for node in range(nodes):
                event = heartbeat(node, seq)
                await producer.send(topic_of(event).name, encode(event), key=key_of(event))
                sent += 1
            await producer.flush()
            next_at += 1.0
            await asyncio.sleep(max(0.0, next_at - loop.time()))
    finally:
        await producer.stop()
    return sent


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(log_path=Path(tmp) / "broker.log") as broker:
        asyncio.run(ensure_topics(broker.bootstrap))
        env = {**os.environ, "SHARDYARD_KAFKA_BOOTSTRAP": broker.bootstrap, "PYTHONUNBUFFERED": "1"}
        port = free_port()
        logs = [open(Path(tmp) / f"{name}.log", "wb") for name in ("pool", "monitor")]  # noqa: SIM115
        pool = subprocess.Popen(
            [sys.executable, "-m", "shardyard.resource_pool"], env=env, stdout=logs[0], stderr=subprocess.STDOUT
        )
        monitor = subprocess.Popen(
            [sys.executable, "-m", "shardyard.monitor", "--http-port", str(port)],
            env=env,
            stdout=logs[1],
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    fetch(f"{url}/healthz")
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise SystemExit("the monitor did not start") from None
                    time.sleep(0.2)
            start = time.monotonic()
            end = start + args.warmup + args.seconds
            samples: dict[str, Any] = {}

            async def run() -> int:
                beating = asyncio.create_task(beat(broker.bootstrap, args.nodes, end))
                await asyncio.sleep(args.warmup)
                cpu0, t0 = cpu_seconds(monitor.pid), time.monotonic()
                rss, api_ms = [], []
                while time.monotonic() < end - 0.5:
                    began = time.monotonic()
                    await asyncio.to_thread(fetch, f"{url}/api/nodes")
                    await asyncio.to_thread(fetch, f"{url}/metrics")
                    api_ms.append((time.monotonic() - began) * 1000)
                    rss.append(rss_mib(monitor.pid))
                    await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
                cpu1, t1 = cpu_seconds(monitor.pid), time.monotonic()
                nodes = json.loads(await asyncio.to_thread(fetch, f"{url}/api/nodes"))["nodes"]
                samples.update(
                    cpu_percent=round(100 * (cpu1 - cpu0) / (t1 - t0), 1),
                    rss_mib_max=round(max(rss), 1),
                    rss_mib_last=round(rss[-1], 1),
                    api_nodes_plus_metrics_ms_p50=round(sorted(api_ms)[len(api_ms) // 2], 1),
                    nodes_seen=len(nodes),
                )
                return await beating

            sent = asyncio.run(run())
        finally:
            for process in (monitor, pool):
                process.terminate()
                process.wait(15)
            for log in logs:
                log.close()
    print(
        json.dumps(
            {
                "bench": "monitor",
                "nodes": args.nodes,
                "heartbeats_per_s": args.nodes,
                "heartbeats_sent": sent,
                "measured_s": args.seconds,
                **samples,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
