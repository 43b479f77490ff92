"""The monitor's overhead while many nodes heartbeat (prints JSON).

An embedded broker, a resource pool (which turns heartbeats into node states, as in production) and one monitor run as
real processes; this process publishes a heartbeat for each of ``--nodes`` simulated nodes (8 GPUs each) every second,
spread evenly over the second as independent agents would send them. With ``--pool simulated`` there is no pool
process: this one publishes each node state itself, made by the pool's core, so the monitor gets what a pool that
keeps up would send (a real pool's pace shows as ``node_states_per_s``). After a warm-up, every process's CPU time and
the monitor's resident memory are sampled from ``/proc`` over ``--seconds``; the monitor's ``/api/nodes`` and
``/metrics`` are read once a second meanwhile, as a dashboard and a scraper would, with its consumer lag from the
latter. At the end: how many nodes the monitor shows, how many with a heartbeat under ``FRESH_S`` old, and how long
heartbeats took to reach it.

This process's own CPU is reported too: the publisher and the readers must not be what loads the machine.

    python bench/monitor.py [--nodes 1000] [--seconds 30] [--pool process|simulated] [--smoke]
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
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from shardyard.broker.embedded import EmbeddedBroker
from shardyard.broker.ports import free_port
from shardyard.bus.admin import ensure_topics
from shardyard.bus.assigned import partitions_of
from shardyard.bus.codec import encode, key_of
from shardyard.bus.topics import HEARTBEATS, NODE_STATE
from shardyard.events import GpuStatus, Heartbeat
from shardyard.events.base import new_event_id
from shardyard.resource_pool.book import PoolBook
from smoke import parse_args

TICKS = os.sysconf("SC_CLK_TCK")
SLICES = 20
"""Each second's heartbeats go out in this many slices, 50 ms apart (a burst of every node at once is no cluster)."""
FRESH_S = 3.0
"""A node shown with a heartbeat older than this is stale (the resource pool calls it SUSPECT at 3 s)."""
SMOKE = {"nodes": 20, "seconds": 2.0, "warmup": 1.0}


def samples(scraped: bytes, name: str) -> list[tuple[str, float]]:
    """The samples of one family of a scrape: (labels, value). Only that family's lines are read, not the ~3 MB."""
    head = scraped.find(f"# TYPE {name} ".encode())
    if head < 0:
        return []
    start = scraped.find(b"\n", head) + 1
    end = scraped.find(b"\n# ", start)
    found = []
    for line in scraped[start : end if end >= 0 else len(scraped)].decode().splitlines():
        labels, _, value = line[len(name) :].rpartition(" ")
        found.append((labels, float(value)))
    return found


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


class Beats:
    """Every node heartbeats once a second: node ``n`` in slice ``n % SLICES`` of each second. With a ``pool``, each
    heartbeat is followed by the node state the resource pool's core makes of it, as a pool that keeps up would
    publish it."""

    def __init__(self, nodes: int, pool: PoolBook | None = None) -> None:
        self.nodes = [heartbeat(node, 0) for node in range(nodes)]  # templates: a beat renews id, time and seq
        self.pool = pool
        self.sent = 0

    async def run(self, bootstrap: str, until: float) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=5)
        await producer.start()
        try:
            loop = asyncio.get_running_loop()
            next_at, tick = loop.time(), 0
            while time.monotonic() < until:
                seq, part = tick // SLICES + 1, tick % SLICES
                now = datetime.now(UTC)
                for node in self.nodes[part::SLICES]:
                    beat = node.model_copy(update={"event_id": new_event_id(), "occurred_at": now, "seq": seq})
                    await producer.send(HEARTBEATS.name, encode(beat), key=key_of(beat))
                    for state in self.pool.on_heartbeat(beat, now) if self.pool else ():
                        await producer.send(NODE_STATE.name, encode(state), key=key_of(state))
                    self.sent += 1
                tick += 1
                next_at += 1.0 / SLICES
                await asyncio.sleep(max(0.0, next_at - loop.time()))
        finally:
            await producer.stop()


def fetch(url: str) -> tuple[bytes, float]:
    """The body and the milliseconds it took."""
    began = time.monotonic()
    with urllib.request.urlopen(url, timeout=10) as response:
        body = bytes(response.read())
    return body, (time.monotonic() - began) * 1000


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGKILL if that has not ended it within 15 s (an error being raised is not hidden by a hang)."""
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        print(f"pid {process.pid} ignored SIGTERM for 15 s: killed", file=sys.stderr)
        process.kill()
        process.wait()


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) if ordered else float("nan")


def fresh_nodes(nodes: list[dict[str, Any]], at: datetime) -> int:
    return sum(1 for n in nodes if (at - datetime.fromisoformat(n["last_heartbeat_at"])).total_seconds() < FRESH_S)


async def records_in(bootstrap: str, topic: str) -> int:
    """Records written to ``topic`` so far (the sum of its partitions' end offsets)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        partitions = await partitions_of(consumer, [topic])
        ends: dict[TopicPartition, int] = await consumer.end_offsets(partitions)
        return sum(ends.values())
    finally:
        await consumer.stop()


async def measure(url: str, bootstrap: str, pids: dict[str, int], beats: Beats, seconds: float) -> dict[str, Any]:
    """Sample for ``seconds``: CPU of every process, the monitor's memory, API latencies and consumer lag."""
    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    own0, sent0, t0 = os.times(), beats.sent, time.monotonic()
    rss, nodes_ms, metrics_ms, both_ms, lag = [], [], [], [], []
    worst: dict[str, float] = {}
    states0 = await records_in(bootstrap, NODE_STATE.name)
    while time.monotonic() < t0 + seconds:
        began = time.monotonic()
        _body, ms_nodes = await asyncio.to_thread(fetch, f"{url}/api/nodes")
        scraped, ms_metrics = await asyncio.to_thread(fetch, f"{url}/metrics")
        nodes_ms.append(ms_nodes)
        metrics_ms.append(ms_metrics)
        both_ms.append((time.monotonic() - began) * 1000)
        by_topic = {
            topic.split('"')[1]: behind for topic, behind in samples(scraped, "shardyard_monitor_consumer_lag_messages")
        }
        lag.append(sum(by_topic.values()))
        for topic, behind in by_topic.items():
            worst[topic] = max(worst.get(topic, 0.0), behind)
        rss.append(rss_mib(pids["monitor"]))
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
    elapsed, own1 = time.monotonic() - t0, os.times()
    states = await records_in(bootstrap, NODE_STATE.name) - states0
    cpu = {f"cpu_percent_{n}": round(100 * (cpu_seconds(pid) - cpu0[n]) / elapsed, 1) for n, pid in pids.items()}
    own = (own1.user + own1.system) - (own0.user + own0.system)
    body, _ms = await asyncio.to_thread(fetch, f"{url}/api/nodes")
    shown, at = json.loads(body)["nodes"], datetime.now(UTC)
    scraped, _ms = await asyncio.to_thread(fetch, f"{url}/metrics")
    transit = [seconds for _node, seconds in samples(scraped, "shardyard_heartbeat_lag_seconds")]
    return {
        "heartbeats_per_s_sent": round((beats.sent - sent0) / elapsed, 1),
        "node_states_per_s": round(states / elapsed, 1),
        "cpu_percent": cpu.pop("cpu_percent_monitor"),
        **cpu,
        "cpu_percent_bench": round(100 * own / elapsed, 1),
        "rss_mib_max": round(max(rss), 1),
        "rss_mib_last": round(rss[-1], 1),
        "api_nodes_plus_metrics_ms_p50": percentile(both_ms, 0.5),
        "api_nodes_ms_p50": percentile(nodes_ms, 0.5),
        "api_nodes_ms_p90": percentile(nodes_ms, 0.9),
        "metrics_ms_p50": percentile(metrics_ms, 0.5),
        "metrics_ms_p90": percentile(metrics_ms, 0.9),
        "metrics_bytes": len(scraped),
        "consumer_lag_messages_p50": percentile(lag, 0.5),
        "consumer_lag_messages_max": max(lag),
        "consumer_lag_messages_max_by_topic": {topic: behind for topic, behind in sorted(worst.items()) if behind},
        "nodes_seen": len(shown),
        "nodes_fresh": fresh_nodes(shown, at),
        "heartbeat_transit_s_p50": percentile(transit, 0.5),
        "heartbeat_transit_s_max": percentile(transit, 1.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument(
        "--pool",
        choices=("process", "simulated"),
        default="process",
        help="the node states: from a resource pool process, or published here by the pool's core (the monitor alone)",
    )
    args = parse_args(parser, SMOKE)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(log_path=Path(tmp) / "broker.log") as broker:
        asyncio.run(ensure_topics(broker.bootstrap))
        env = {**os.environ, "SHARDYARD_KAFKA_BOOTSTRAP": broker.bootstrap, "PYTHONUNBUFFERED": "1"}
        port = free_port()
        logs = [open(Path(tmp) / f"{name}.log", "wb") for name in ("pool", "monitor")]  # noqa: SIM115
        pool = (
            subprocess.Popen(
                [sys.executable, "-m", "shardyard.resource_pool"], env=env, stdout=logs[0], stderr=subprocess.STDOUT
            )
            if args.pool == "process"
            else None
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
            assert broker.pid is not None
            pids = {"monitor": monitor.pid, "broker": broker.pid} | ({"pool": pool.pid} if pool else {})
            beats = Beats(args.nodes, PoolBook() if args.pool == "simulated" else None)

            async def run() -> dict[str, Any]:
                end = time.monotonic() + args.warmup + args.seconds
                beating = asyncio.create_task(beats.run(broker.bootstrap, end))
                await asyncio.sleep(args.warmup)
                samples = await measure(url, broker.bootstrap, pids, beats, args.seconds)
                await beating
                return samples

            samples = asyncio.run(run())
        finally:
            for process in (monitor, pool):
                if process is not None:
                    stop(process)
            for log in logs:
                log.close()
    print(
        json.dumps(
            {
                "bench": "monitor",
                "nodes": args.nodes,
                "pool": args.pool,
                "heartbeats_per_s": args.nodes,
                "heartbeats_sent": beats.sent,
                "measured_s": args.seconds,
                **samples,
                "load_average_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
                "cpus": os.cpu_count(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
