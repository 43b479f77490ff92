"""The control plane at 100 to 10,000 nodes (prints JSON).

Each size gets a fresh local cluster as ``shardyard up`` starts it (on the local Apache Kafka, ``--broker embedded``
the fallback; plain, not TLS: the broker's transport security is not what is measured; two replicas each of the
queue, scheduler, resource pool and fault manager, the monitor; no agents). One process (``scale_nodes.py``)
heartbeats N simulated 8-GPU A100 nodes at 1 Hz in the agents' own message format and answers their assignments as
agents would (``ShardStarted`` at once, ``ShardCompleted`` ``--shard-s`` later). This one submits a steady stream of
1-, 2- and 8-GPU jobs (``--rate`` a second, keyed by task id as ``shardyard submit`` keys them) whose model and
dataset every node reports on the shared mount. After ``--warmup-s``, over ``--window-s``:

- submission -> accepted / ready / scheduled latency of the jobs submitted in the window (p50/p95/p99, ms): the
  lifecycle topic is read here with no group; times are when each event *arrived here* minus when it was handed to
  the producer, both on this machine's wall clock (``latency_clock``);
- false SUSPECT / LOST node states and ``NodeLost`` failures (for nodes still heartbeating), and the detection time
  of ``--stop-nodes`` nodes whose heartbeats stop ``--stop-after-s`` into the window: from their last heartbeat to
  the pool's first SUSPECT and LOST (``occurred_at``; ``_seen``: arrival here);
- CPU per process (``/proc``: every service replica, the broker, the node simulator and this process), the node
  simulator's CPU per node, and the broker's resident memory and CPU every ``--lag-every-s`` (``broker_over_time``);
- heartbeats handled per second by each pool replica (its ``shardyard_events_consumed_total`` for the heartbeats
  topic), node states per second on the bus, consumer-group lag (committed offsets against corrected end offsets,
  every ``--lag-every-s`` and at the end) and the processes' own ``shardyard_consumer_lag_messages``;
- submit -> scheduled p50 and p99 of the jobs submitted in each minute of the window (``by_minute``);
- in the summary, the growth of submit -> scheduled p50 and p99 against the 100-node size.

``--burst COUNT`` instead submits COUNT jobs at once after the warm-up and reports accepted/s and scheduled/s
sustained (count over the time from the first submission to the last acceptance / placement), and how many were not
placed within ``--burst-timeout-s``.

    python bench/scale.py [--nodes 100,1000,5000,10000] [--runs 1] [--warmup-s 20] [--window-s 120] [--rate 5]
    python bench/scale.py --burst 2000 [--nodes 1000]
    python bench/scale.py --smoke
"""

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from scale_bus import BusWatch, GroupLag, cpu_seconds, metric_lag, rss_mib, scrape
from scale_nodes import DATASET_PATH, MODEL_PATH
from scale_report import (
    MIX,
    burst_figures,
    cycle_figures,
    lag_figures,
    latencies,
    node_faults,
    summarize,
    window_figures,
)
from shardyard.bus.address import BROKER_ENV
from shardyard.bus.quirks import on_tansu
from shardyard.bus.topics import SUBMISSIONS
from shardyard.cli import cluster
from shardyard.cli.team_files import sealed_env
from smoke import parse_args

NODES_SCRIPT = Path(__file__).with_name("scale_nodes.py")
NOTES = [
    "latency: arrival of the lifecycle event at this process minus the submission's hand-over to the producer, one"
    " wall clock; by_occurred_at uses the event's own occurred_at instead (what reading it here adds is the gap)",
    "simulated nodes report the jobs' model and dataset as shared artifacts in every heartbeat (a real agent reports"
    " a path only while a live job names it)",
    "the node simulator publishes every node's heartbeats through one producer, batching them (linger_ms); with"
    " --publisher relay (the default) it sends each slice's leases as one NodeLeases record a partition, as a"
    " per-host relay would, and full heartbeats one a node",
]
TANSU_NOTE = (
    "Tansu answers ListOffsets latest with the last batch's base offset + 1: group lag here uses end offsets"
    " corrected by reading each partition's last batch; the processes' own lag metric is not corrected"
)


def say(message: str) -> None:
    print(f"[scale] {message}", file=sys.stderr, flush=True)


def job(job_id: str, gpus: int) -> bytes:
    return json.dumps(
        {
            "task_id": job_id,
            "task_type": "micro_train",
            "resource_requirements": {"gpu": {"count": gpus, "model": "A100"}, "memory": f"{8 * gpus}GiB"},
            "priority": 5,
            "dependencies": {"pretrained_model": MODEL_PATH, "dataset": DATASET_PATH},
            "shard_count": gpus,
            "sync_interval": 10,
            "training": {"max_steps": 20},
        }
    ).encode()


async def until(check: Callable[[], bool], timeout_s: float, every_s: float = 0.1) -> bool:
    """Wait for ``check()`` for at most ``timeout_s``; whether it held."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(every_s)
    return True


async def at(wall: float) -> None:
    """Until the wall-clock time ``wall`` (a phase boundary, not a wait for something to happen)."""
    await asyncio.sleep(max(0.0, wall - time.time()))


class NodesProcess:
    """The node simulator, driven over its stdin/stdout (see ``scale_nodes.py``)."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        self.log = log

    @classmethod
    async def start(
        cls, args: argparse.Namespace, bootstrap: str, n: int, root: Path, max_s: float, secret_file: str = ""
    ) -> "NodesProcess":
        log = root / "nodes.log"
        argv = [str(NODES_SCRIPT), "--bootstrap", bootstrap, "--nodes", str(n), "--data-root", str(root / "data")]
        argv += ["--shard-s", str(args.shard_s), "--max-s", str(max_s)]
        argv += ["--relay"] if args.publisher == "relay" else []
        env = {**os.environ, **sealed_env(secret_file)}
        with log.open("wb") as err:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env=env,
            )
        return cls(process, log)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def expect(self, event: str, timeout_s: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = await asyncio.wait_for(self.process.stdout.readline(), max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                line = b""
            if not line:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise SystemExit(f"the node simulator gave no {event!r} within {timeout_s:.0f}s; its log ends:\n{tail}")
            answer: dict[str, Any] = json.loads(line)
            if answer.get("event") == event:
                return answer

    async def command(self, cmd: dict[str, Any], expect: str | None, timeout_s: float = 30) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(cmd).encode() + b"\n")
        await self.process.stdin.drain()
        return await self.expect(expect, timeout_s) if expect else {}

    async def close(self) -> dict[str, Any]:
        try:
            return await self.command({"cmd": "exit"}, "report", timeout_s=20)
        except (SystemExit, ConnectionError) as exc:
            say(f"the node simulator did not report: {exc}")
            return {}
        finally:
            if self.process.returncode is None:
                try:
                    await asyncio.wait_for(self.process.wait(), 10)
                except TimeoutError:
                    self.process.kill()
                    await self.process.wait()


class Submitter:
    """Jobs to the submissions topic, keyed by task id; the time each was handed to the producer."""

    def __init__(self, bootstrap: str, prefix: str, seed: int) -> None:
        self.producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, linger_ms=5)
        self.prefix = prefix
        self.rng = random.Random(seed)
        self.sent: dict[str, float] = {}
        self.phase: dict[str, str] = {}
        self.gpus: dict[str, int] = {}
        self.futures: list[asyncio.Future[Any]] = []

    async def submit(self, phase: str) -> None:
        gpus = self.rng.choices([g for g, _ in MIX], weights=[w for _, w in MIX])[0]
        job_id = f"{self.prefix}-{len(self.sent):06d}"
        raw = job(job_id, gpus)
        self.sent[job_id], self.phase[job_id], self.gpus[job_id] = time.time(), phase, gpus
        self.futures.append(await self.producer.send(SUBMISSIONS.name, raw, key=job_id.encode()))

    async def stream(self, rate: float, warm_end: float, end: float) -> None:
        next_at = time.time()
        while next_at < end:
            await self.submit("warmup" if next_at < warm_end else "window")
            next_at += 1.0 / rate
            await at(next_at)

    def of(self, phase: str) -> list[str]:
        return [j for j, p in self.phase.items() if p == phase]


async def snapshot(info: cluster.ClusterInfo, pids: dict[str, int], watch: BusWatch) -> dict[str, Any]:
    texts = dict(
        zip(
            info.metrics_ports,
            await asyncio.gather(*(asyncio.to_thread(scrape, p) for p in info.metrics_ports.values())),
            strict=True,
        )
    )
    return {
        "t": time.monotonic(),
        "cpu": {n: cpu_seconds(p) for n, p in pids.items()},
        "metrics": texts,
        "node_states": watch.node_states,
    }


async def lag_sample(lag: GroupLag, info: cluster.ClusterInfo) -> dict[str, Any]:
    services = {n: p for n, p in info.metrics_ports.items() if n != "broker"}
    texts = await asyncio.gather(*(asyncio.to_thread(scrape, port) for port in services.values()))
    broker = info.pids.get("broker", 0)
    return {
        "groups": await lag.sample(),
        "metric": metric_lag(dict(zip(services, texts, strict=True))),
        "broker": {"t": time.monotonic(), "rss_mib": rss_mib(broker), "cpu_s": cpu_seconds(broker)},
    }


async def sample_lag(lag: GroupLag, info: cluster.ClusterInfo, every_s: float, end: float, into: list[Any]) -> None:
    """A lag sample every ``every_s`` until the wall-clock time ``end``."""
    while (due := time.time() + every_s) < end:
        await at(due)
        into.append(await lag_sample(lag, info))


async def measure(info: cluster.ClusterInfo, args: argparse.Namespace, n: int, run: int, root: Path) -> dict[str, Any]:
    burst = bool(args.burst)
    watch, lag = BusWatch(info.bootstrap), GroupLag(info.bootstrap)
    sub = Submitter(info.bootstrap, f"scale-{n}-{run}", seed=run)
    await asyncio.gather(watch.start(), lag.start(), sub.producer.start())
    budget = 180 + args.ready_timeout_s + args.warmup_s + args.window_s + args.drain_s + args.burst_timeout_s
    nodes = await NodesProcess.start(args, info.bootstrap, n, root, max_s=budget, secret_file=info.secret_file)
    result: dict[str, Any] = {"nodes": n, "run": run + 1, "mode": "burst" if burst else "stream"}
    result["sealed"] = bool(info.secret_file)
    report: dict[str, Any] = {}
    try:
        ready = await nodes.expect("ready", 60 + n / 100)
        result["heartbeat_encoder"] = ready["encoder"]
        began = time.monotonic()
        seen = await until(lambda: len(watch.seen_nodes) >= n, args.ready_timeout_s)
        result["nodes_seen"], result["nodes_seen_after_s"] = len(watch.seen_nodes), round(time.monotonic() - began, 1)
        if not seen:
            say(f"only {len(watch.seen_nodes)} of {n} nodes have a node state after {args.ready_timeout_s}s: going on")
        pids = {**info.pids, "nodes": nodes.pid, "bench": os.getpid()}
        say(f"{n} nodes heartbeating; warm-up {args.warmup_s}s")
        warm_end = time.time() + args.warmup_s
        end = warm_end + (0 if burst else args.window_s)
        stream = None if burst else asyncio.create_task(sub.stream(args.rate, warm_end, end))
        await at(warm_end)
        first, mark0 = await snapshot(info, pids, watch), await nodes.command({"cmd": "mark"}, "mark")
        taken: list[dict[str, Any]] = []
        victims: dict[str, float] = {}
        stopped_at = float("inf")
        if burst:
            say(f"burst of {args.burst} jobs")
            t0 = time.time()
            for _ in range(args.burst):
                await sub.submit("burst")
            jobs = sub.of("burst")
            await until(lambda: all("scheduled" in watch.jobs.get(j, {}) for j in jobs), args.burst_timeout_s, 0.25)
        else:
            say(f"window of {args.window_s}s at {args.rate} jobs/s")
            sampler = asyncio.create_task(sample_lag(lag, info, args.lag_every_s, end - 1, taken))
            if args.stop_nodes:
                await at(min(warm_end + args.stop_after_s, end - 2))
                ids = [f"sim-{n * (k + 1) // (args.stop_nodes + 1):05d}" for k in range(args.stop_nodes)]
                stopped_at = time.time()
                victims = (await nodes.command({"cmd": "stop", "nodes": ids}, "stopped"))["last_beat"]
                say(f"stopped the heartbeats of {', '.join(ids)}")
            assert stream is not None
            await asyncio.gather(stream, sampler)
            jobs = sub.of("window")
        last, mark1 = await snapshot(info, pids, watch), await nodes.command({"cmd": "mark"}, "mark")
        w1 = time.time()
        taken.append(await lag_sample(lag, info))
        if not burst:

            def settled() -> bool:
                lost = {node for node, _s, _o, _r in watch.not_alive if _s == "LOST"}
                return set(victims) <= lost and all("scheduled" in watch.jobs.get(j, {}) for j in jobs)

            say(f"window over; waiting up to {args.drain_s}s for its jobs to be placed and the stopped nodes LOST")
            await until(settled, args.drain_s, 0.25)
        result |= window_figures(first, last)
        result["publisher"] = args.publisher
        result["heartbeats_sent_per_s"] = round((mark1["sent"] - mark0["sent"]) / result["measured_s"], 1)
        result["beats_sent_per_s"] = round((mark1["beats"] - mark0["beats"]) / result["measured_s"], 1)
        # percent of a core is 10 ms of CPU a second
        result["node_simulator_cpu_ms_per_node_per_s"] = round(result["cpu_percent"].get("nodes", 0) * 10 / n, 3)
        result["broker_over_time"] = broker_over_time(first, taken)
        result["node_simulator"] = {k: mark1[k] - mark0[k] for k in mark1 if k != "event" and k in mark0}
        result["node_simulator"]["tick_late_ms_max"] = mark1["tick_late_ms_max"]
        result["latency_clock"] = "arrival here (time.time()) minus hand-over to the producer (time.time())"
        result["latency"] = latencies(watch, sub.sent, sub.gpus, jobs)
        result["submit_errors"] = sum(1 for f in sub.futures if not f.done() or f.exception() is not None)
        result["scheduler_cycles"] = cycle_figures(first, last)
        if burst:
            result["burst"] = burst_figures(watch, jobs, t0)
        result |= node_faults(watch, victims, stopped_at, warm_end, w1)
        result["consumer_lag"] = lag_figures(taken, lag.error)
    finally:
        report = await nodes.close()
        await asyncio.gather(watch.stop(), lag.stop(), sub.producer.stop(), return_exceptions=True)
    result["node_simulator_totals"] = {k: v for k, v in report.items() if k != "event"}
    return result


def broker_over_time(first: dict[str, Any], taken: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The broker's resident memory at each lag sample, and its CPU since the one before (from the window's start)."""
    series, t0 = [], first["t"]
    before_t, before_cpu = first["t"], first["cpu"].get("broker")
    for sample in taken:
        broker = sample["broker"]
        used = None
        if before_cpu is not None and broker["cpu_s"] is not None and broker["t"] > before_t:
            used = round(100 * (broker["cpu_s"] - before_cpu) / (broker["t"] - before_t), 1)
        series.append({"at_s": round(broker["t"] - t0, 1), "rss_mib": broker["rss_mib"], "cpu_percent": used})
        before_t, before_cpu = broker["t"], broker["cpu_s"]
    return series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--nodes", default=None, help="sizes, comma-separated (default 100,1000,5000,10000; 1000 with --burst)"
    )
    parser.add_argument("--runs", type=int, default=1, help="repeat every size this many times")
    parser.add_argument("--warmup-s", type=float, default=20.0)
    parser.add_argument("--window-s", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=5.0, help="jobs submitted per second")
    parser.add_argument("--shard-s", type=float, default=3.0, help="how long a simulated shard runs")
    parser.add_argument("--stop-nodes", type=int, default=3, help="nodes whose heartbeats stop during the window")
    parser.add_argument(
        "--stop-after-s", type=float, default=None, help="when, into the window (default: a quarter, at most 20 s)"
    )
    parser.add_argument("--lag-every-s", type=float, default=15.0, help="consumer-lag sampling period")
    parser.add_argument(
        "--drain-s", type=float, default=30.0, help="after the window: wait this long at most for its jobs"
    )
    parser.add_argument(
        "--ready-timeout-s", type=float, default=60.0, help="wait this long at most for every node's first state"
    )
    parser.add_argument("--burst", type=int, default=0, help="submit this many jobs at once instead of a stream")
    parser.add_argument("--burst-timeout-s", type=float, default=120.0)
    parser.add_argument("--logs", type=Path, default=None, help="copy each cluster's logs under this folder")
    parser.add_argument(
        "--sign-events",
        action="store_true",
        help="the cluster seals every event (up --sign-events) and the simulated nodes seal theirs with their keys",
    )
    parser.add_argument(
        "--broker", choices=("kafka", "embedded"), default="kafka", help="the local Apache Kafka, or the fallback"
    )
    parser.add_argument(
        "--publisher",
        choices=("relay", "per-node"),
        default="relay",
        help="leases relayed many to a record (NodeLeases), or one record a node as each agent sends its own",
    )
    tiny = {"nodes": "20", "warmup_s": 5.0, "window_s": 12.0, "rate": 2.0, "stop_nodes": 1, "lag_every_s": 4.0}
    args = parse_args(parser, tiny | {"drain_s": 20.0, "ready_timeout_s": 30.0, "shard_s": 1.0})
    args.nodes = args.nodes or ("1000" if args.burst else "100,1000,5000,10000")
    if args.stop_after_s is None:
        args.stop_after_s = min(20.0, args.window_s / 4)
    if args.burst:
        args.window_s = args.stop_nodes = 0
    sizes = [int(part) for part in args.nodes.split(",") if part.strip()]
    runs: list[dict[str, Any]] = []
    for n in sizes:
        for run in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="shardyard-scale-") as tmp:
                root = Path(tmp)
                (root / "data").mkdir()
                say(f"{n} nodes, run {run + 1}/{args.runs}: starting the cluster")
                try:
                    info = cluster.up(
                        root / "run",
                        nodes=(),
                        data_root=root / "data",
                        say=say,
                        sign_events=args.sign_events,
                        broker=args.broker,
                    )
                    os.environ[BROKER_ENV] = info.broker  # this process's and the node simulator's clients
                    try:
                        runs.append(asyncio.run(measure(info, args, n, run, root)))
                    finally:
                        cluster.down(root / "run", say=say)
                except (Exception, SystemExit) as exc:  # one size failing does not lose the others
                    say(f"{n} nodes, run {run + 1} failed: {exc}")
                    runs.append({"nodes": n, "run": run + 1, "error": str(exc)[-2000:]})
                finally:
                    if args.logs is not None:
                        shutil.copytree(
                            root,
                            args.logs / f"{n}-{run + 1}",
                            dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("data"),
                        )
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    notes = [*NOTES, TANSU_NOTE] if on_tansu() else NOTES
    out = {"benchmark": "scale", "config": config, "runs": runs, "summary": summarize(runs), "notes": notes}
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
