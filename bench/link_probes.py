"""What link probing costs at scale, per node and per round (prints JSON).

For each N of ``--nodes``, on a fresh embedded broker: N simulated nodes in ``--workers`` processes, each node the
agent's own ``LinkProber`` and ``ProbeServer`` (as ``shardyard.node_agent.links.probing_parts`` builds them) on a
loopback address of its own (127.10.x.y, one port for all). Each worker process publishes its nodes' ``LinkMeasured``
through one real ``shardyard.bus.kafka.Bus``. Every prober is handed the whole node directory (a ``NodeState`` per
node, built here rather than read off the node-state topic) and every assignment of the gangs (``--gang-fraction`` of
the nodes, in gangs of 2, 4 and 8, all training: their links get pings, and no burst after the one at formation).

Two phases: **formation** (the agent's 0.25 s check measures each new gang's links, burst included) and then
**rounds**: ``--rounds`` rounds per node at the agent's cadence (``Periodic``'s: every interval from a start, at once
when late), the nodes' starts spread over the interval as independent agents' are, the formation check still running.
The interval is ``--interval-s``, or longer where N nodes' probes would offer this machine more than ``--pace``
probes a second (both ends of every probe run here: past that the event loops lag beyond the probes' 2 s timeout,
and probes fail that would not on a cluster); it changes nothing per node per round. The figures of a phase are the
deltas of the probers' ``ProbeCounters`` over it:

- probes, probe payload (``bytes_sent``: what probers send; the endpoints echo as much for pings) and ``LinkMeasured``
  messages onto the broker: totals a second at this run's pace, PER NODE PER ROUND (``per_node_growth``: the largest
  N's over the smallest N's, target <= 1.2), and projected at the agent's defaults, per node and for the cluster;
- probes per node per round against what ``peers_to_probe`` promises: k + the node's gang peers;
- CPU per node per round (both ends of every probe run here) and one ``peers_to_probe`` call's time at N;
- the consumer side: the links topic's messages, bytes and distinct keys (directed pairs) after the run and the time
  to fold them into a ``LinkTable``; then what a long run leaves (every directed pair, N(N-1), once the rotation has
  come round: nothing retires a key or a table entry) and the scheduler's refresh (``LinkView.figures``, every 2 s)
  over such a table, and over its fresh entries alone.

Bursts are ``--burst-bytes`` (64 KiB by default, not the agent's 4 MiB, so that 1,000 nodes fit two cores), and a
probe step times out after ``--timeout-s`` (10 s, not the agent's 2 s: on a shared machine every process stalls for
seconds at times, which would fail probes that a cluster's nodes would not). Wire bytes are an estimate: payload both
ways, plus 66 bytes (Ethernet, IPv4, TCP with timestamps) per segment, a ping-only probe's segments counted once here
on loopback (the whole namespace's count: other traffic adds to it), a burst's at 1.5 segments (data and ACKs) per
1448 bytes. The RTTs measured are event-loop latencies on a shared
machine and mean nothing here.

    python bench/link_probes.py [--nodes 100,300,1000] [--workers 4] [--rounds 3] [--interval-s 2] [--pace 250]
        [--smoke]
"""

import argparse
import asyncio
import json
import logging
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from shardyard.broker.embedded import EmbeddedBroker
from shardyard.broker.ports import free_port
from shardyard.bus.admin import ensure_topics
from shardyard.bus.codec import decode
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.topics import LINKS
from shardyard.clock import SystemClock
from shardyard.events import LinkMeasured, NodeState, NodeStatus, ShardAssignment, Workload
from shardyard.links import LinkTable, peers_to_probe
from shardyard.netprobe import ProbeClient, ProbeServer, bind_endpoint
from shardyard.node_agent.links import LinkProber, ProbeSettings, probing_parts
from shardyard.scheduler.links import REFRESH_S, LinkFigures, LinkView
from shardyard.service import Periodic
from smoke import parse_args

GANG_SIZES = (2, 4, 8)
HEADER_BYTES = 66
MSS = 1448
DEFAULTS = ProbeSettings()
FORMATION_TIMEOUT_S = 180.0
TARGET_GROWTH = 1.2
TARGET_FAILED = 0.01
SMOKE = {"nodes": "6,12", "workers": 2, "rounds": 1, "interval_s": 1.0}


# --- the simulated cluster (both sides build the same one from N) -------------------------------------------------
def address(index: int) -> str:
    return f"127.10.{index // 250}.{index % 250 + 1}"


def node_id(index: int) -> str:
    return f"n-{index:05d}"


def gangs(nodes: int, fraction: float) -> list[list[int]]:
    """``fraction`` of the nodes (a fixed shuffle) in gangs of 2, 4 and 8 in turn."""
    chosen = random.Random(7).sample(range(nodes), int(nodes * fraction))
    found: list[list[int]] = []
    at = 0
    for size in GANG_SIZES * nodes:
        if at + size > len(chosen):
            break
        found.append(chosen[at : at + size])
        at += size
    return found


def directory(nodes: int, port: int, now: datetime) -> list[NodeState]:
    def state(i: int) -> NodeState:
        return NodeState(
            occurred_at=now,
            node_id=node_id(i),
            status=NodeStatus.ALIVE,
            agent_instance=f"{node_id(i)}-1",
            host=address(i),
            address=address(i),
            rendezvous_ports=(29500, 63),
            probe_port=port,
            last_heartbeat_at=now,
            gpus=(),
            cpu_cores=128.0,
            memory_bytes=1024**4,
            cpu_load=0.0,
        )

    return [state(i) for i in range(nodes)]


def assignments(teams: list[list[int]], now: datetime) -> list[ShardAssignment]:
    work = Workload(
        model_path="/data/m",
        dataset_path="/data/d",
        output_path="/data/o",
        sync_interval=1,
        max_steps=100,
        batch_size=8,
        seq_len=64,
        lr=1e-3,
        seed=0,
    )
    return [
        ShardAssignment(
            occurred_at=now,
            job_id=f"job-{g}",
            shard_index=shard,
            world_size=len(team),
            node_id=node_id(member),
            gpu_indices=(0,),
            attempt=1,
            term=1,
            master_addr=address(team[0]),
            master_port=29500,
            workload=work,
        )
        for g, team in enumerate(teams)
        for shard, member in enumerate(team)
    ]


# --- a worker process: its share of the nodes -----------------------------------------------------------------------
@dataclass
class SimNode:
    index: int
    prober: LinkProber
    server: ProbeServer
    formed: Periodic
    """The agent's 0.25 s check for newly formed gangs."""
    expected: int
    """Peers a round as ``peers_to_probe`` promises: k (at most the non-gang others) + gang peers."""
    took: list[float] = field(default_factory=list)
    late: list[float] = field(default_factory=list)
    bursts: int = 0
    probes_before: int = 0


def totals(nodes: list[SimNode]) -> dict[str, int]:
    keys = ("rounds", "probes", "failed", "bytes_sent", "events")
    sums = {k: sum(getattr(n.prober.counters, k) for n in nodes) for k in keys}
    sums["server_requests"] = sum(n.server.requests for n in nodes)
    sums["server_bytes_in"] = sum(n.server.bytes_in for n in nodes)
    return sums


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def formation_done(nodes: list[SimNode]) -> bool:
    counted = totals(nodes)
    owed = any(node.prober.owed() for node in nodes)
    return not owed and counted["events"] + counted["failed"] >= counted["probes"]


def cpu_s() -> float:
    times = os.times()
    return times.user + times.system


async def command() -> dict[str, Any]:
    line = await asyncio.to_thread(sys.stdin.readline)
    if not line:
        raise SystemExit("the bench went away")
    return dict(json.loads(line))


def say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def training(jobs: frozenset[str]) -> Callable[[], frozenset[str]]:
    """The agent's book, as the prober asks it: the jobs with a live shard here (a gang's shards all train)."""
    return lambda: jobs


async def drive(node: SimNode, start: float, rounds: int, interval: float) -> None:
    """``rounds`` rounds from ``start`` (loop time), as the agent's ``Periodic`` runs them."""
    loop = asyncio.get_running_loop()
    for r in range(rounds):
        at = start + r * interval
        await asyncio.sleep(max(0.0, at - loop.time()))
        began = loop.time()
        found = await node.prober.probe_round()
        node.late.append(began - at)
        node.took.append(loop.time() - began)
        node.bursts += sum(1 for m in found if m.burst_bytes > 0)


async def worker(args: argparse.Namespace) -> None:
    n, now = args.n, datetime.now(UTC)
    teams = gangs(n, args.gang_fraction)
    job_of = {member: f"job-{g}" for g, team in enumerate(teams) for member in team}
    size_of = {member: len(team) for team in teams for member in team}
    states, events = directory(n, args.port, now), assignments(teams, now)
    broker = make_broker(args.bootstrap, client_id=f"link-bench-{args.worker}")
    bus = Bus(broker, service="link-bench")
    await broker.start()
    knobs = ProbeSettings(
        interval_s=args.interval_s,
        sample=args.sample,
        pings=args.pings,
        burst_bytes=args.burst_bytes,
        timeout_s=args.timeout_s,
    )
    nodes = []
    for i in range(args.worker, n, args.workers):
        jobs = frozenset({job_of[i]} if i in job_of else ())
        prober = LinkProber(node_id(i), bus, SystemClock(), knobs, running=training(jobs))
        # The agent's endpoint: on the port every node's state advertises (each node has an address of its own).
        _, [_rounds, formed], server = probing_parts(prober, bind_endpoint(address(i), args.port))
        assert server is not None
        for state in states:
            prober.on_node_state(state)
        for event in events:
            prober.on_assignment(event)
        gang = size_of.get(i, 1) - 1
        nodes.append(SimNode(i, prober, server, formed, gang + min(args.sample, n - 1 - gang)))
    for node in nodes:
        await node.server.start()
    say({"event": "ready", "nodes": len(nodes)})

    await command()  # form
    before, began = totals(nodes), time.monotonic()
    for node in nodes:
        node.formed.start()
    # The prober has no event for "nothing owed, all published": look as often as its own check runs, up to a
    # deadline (a measurement is owed no more once made; it is counted in ``events`` once the broker has it).
    while time.monotonic() - began < FORMATION_TIMEOUT_S and not formation_done(nodes):  # noqa: ASYNC110
        await asyncio.sleep(0.25)
    formation = delta(totals(nodes), before)
    owed = sum(node.prober.owed() for node in nodes)
    say({"event": "formed", **formation, "owed_left": owed, "seconds": time.monotonic() - began})

    start = (await command())["start"]  # wall-clock time, the same for every worker
    loop = asyncio.get_running_loop()
    start_loop = loop.time() + (start - time.time())
    before, cpu_before = totals(nodes), cpu_s()
    for node in nodes:
        node.probes_before = node.prober.counters.probes
    await asyncio.gather(
        *(drive(node, start_loop + args.interval_s * node.index / n, args.rounds, args.interval_s) for node in nodes)
    )
    ended = time.time()
    rounds = delta(totals(nodes), before)
    per_node = [[node.prober.counters.probes - node.probes_before, node.expected] for node in nodes]
    say(
        {
            "event": "report",
            **rounds,
            "bursts": sum(node.bursts for node in nodes),
            "ended": ended,
            "took": [t for node in nodes for t in node.took],
            "late": [t for node in nodes for t in node.late],
            "per_node": per_node,
        }
    )
    await command()  # stop: every worker's rounds are over, nobody probes these endpoints any more
    say({"event": "stopped", "cpu_s": cpu_s() - cpu_before})  # the endpoints' work for the others' rounds too
    for node in nodes:
        await node.formed.stop()
        await node.server.stop()
    await broker.stop()


# --- the bench ------------------------------------------------------------------------------------------------------
class Workers:
    """The worker processes of one N, spoken to in JSON lines."""

    def __init__(
        self, args: argparse.Namespace, n: int, interval_s: float, bootstrap: str, port: int, logs: Path
    ) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen[str]] = []
        for w in range(args.workers):
            flags = {
                "--worker": w,
                "--workers": args.workers,
                "--n": n,
                "--bootstrap": bootstrap,
                "--port": port,
                "--interval-s": interval_s,
                "--sample": args.sample,
                "--pings": args.pings,
                "--burst-bytes": args.burst_bytes,
                "--timeout-s": args.timeout_s,
                "--rounds": args.rounds,
                "--gang-fraction": args.gang_fraction,
            }
            argv = [sys.executable, __file__, *(part for flag, value in flags.items() for part in (flag, str(value)))]
            err: IO[str] = open(logs / f"worker-{w}.log", "w")  # noqa: SIM115 - the child holds it
            self.procs.append(
                subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
            )
            err.close()

    def send(self, obj: dict[str, Any]) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(obj) + "\n")
            proc.stdin.flush()

    def expect(self, event: str) -> list[dict[str, Any]]:
        answers = []
        for w, proc in enumerate(self.procs):
            assert proc.stdout is not None
            line = proc.stdout.readline()
            answer = json.loads(line) if line else {}
            if answer.get("event") != event:
                tail = (self.logs / f"worker-{w}.log").read_text()[-3000:]
                raise SystemExit(f"worker {w}: expected {event!r}, got {line!r}; its log:\n{tail}")
            answers.append(answer)
        return answers

    def close(self) -> None:
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def summed(answers: list[dict[str, Any]], key: str) -> Any:
    return sum(answer[key] for answer in answers)


async def read_links(bootstrap: str, expected: int) -> tuple[list[bytes], set[bytes]]:
    """Every record of the links topic, from its start, until ``expected`` or 5 s without one."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, max_partition_fetch_bytes=8 << 20)
    await consumer.start()
    values: list[bytes] = []
    keys: set[bytes] = set()
    try:
        tps = [TopicPartition(LINKS.name, p) for p in range(LINKS.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        idle_since = time.monotonic()
        while len(values) < expected and time.monotonic() - idle_since < 5.0:
            got = await consumer.getmany(timeout_ms=500, max_records=50_000)
            for records in got.values():
                values += [r.value or b"" for r in records]
                keys.update(r.key or b"" for r in records)
                idle_since = time.monotonic()
    finally:
        await consumer.stop()
    return values, keys


def topic_figures(values: list[bytes], keys: set[bytes]) -> dict[str, Any]:
    """The links topic after the run, and the time to fold it into a ``LinkTable`` and derive its links."""
    table = LinkTable()
    began = time.perf_counter()
    for value in values:
        table.apply(decode(LINKS, value))
    folded = time.perf_counter() - began
    began = time.perf_counter()
    found = table.links(datetime.now(UTC))
    derived = time.perf_counter() - began
    return {
        "messages": len(values),
        "bytes": sum(len(v) for v in values),
        "bytes_per_message": round(sum(len(v) for v in values) / max(1, len(values)), 1),
        "distinct_keys": len(keys),
        "fold_s": round(folded, 3),
        "fold_us_per_message": round(folded / max(1, len(values)) * 1e6, 1),
        "links_s": round(derived, 4),
        "links_found": len(found),
    }


def timed_refresh(view: LinkView, now: datetime) -> tuple[float, LinkFigures]:
    began = time.perf_counter()
    figures = view.figures(now)
    return time.perf_counter() - began, figures


def long_run(n: int, gang_avg: float, bytes_per_message: float) -> dict[str, Any]:
    """What the topic and the consumers' table hold once the rotation has come round (agent defaults): every
    directed pair keyed (compaction keeps one record per key; nothing retires a key), those measured within the
    table's ``max_age_s`` fresh, and the scheduler's refresh over that table, and over its fresh entries alone
    (what a table that let go of stale entries would hold)."""
    fresh_per_node = min(n - 1, math.ceil(LinkTable.max_age_s / DEFAULTS.interval_s) * DEFAULTS.sample + gang_avg)
    now = datetime.now(UTC)
    ids = [node_id(i) for i in range(n)]

    def measured(at: datetime) -> LinkMeasured:
        return LinkMeasured(
            occurred_at=at, node_id=ids[0], peer_id=ids[1], rtt_median_ms=0.1, rtt_p90_ms=0.2, samples=5
        )

    fresh, stale = measured(now), measured(now - timedelta(seconds=LinkTable.max_age_s * 2))
    view = LinkView()
    for i, me in enumerate(ids):
        for step in range(1, n):
            key = (me, ids[(i + step) % n])
            is_fresh = step <= fresh_per_node
            view.table.latest[key] = fresh if is_fresh else stale
            if is_fresh:
                view.table.bandwidth[key] = (1e9, now)
    view.apply(fresh)  # a measurement came in: the next refresh works the figures out again
    refresh, figures = timed_refresh(view, now)
    entries = len(view.table.latest)
    for key in [key for key, event in view.table.latest.items() if event is stale]:
        del view.table.latest[key]  # what a table that let go of stale entries would hold
    view.apply(fresh)
    refresh_fresh, _ = timed_refresh(view, now + timedelta(seconds=REFRESH_S))
    rounds = math.ceil((n - 1 - gang_avg) / DEFAULTS.sample)
    return {
        "rounds_to_cover_every_pair": rounds,
        "seconds_to_cover_at_defaults": rounds * DEFAULTS.interval_s,
        "topic_keys": n * (n - 1),
        "topic_bytes_compacted": round(n * (n - 1) * bytes_per_message),
        "table_entries": entries,
        "table_fresh_entries": round(n * fresh_per_node),
        "scheduler_refresh_s": round(refresh, 3),
        "scheduler_refresh_s_fresh_entries_only": round(refresh_fresh, 3),
        "scheduler_refresh_every_s": REFRESH_S,
        "fresh_pairs": len(figures.rtt_ms),
    }


def peers_to_probe_us(n: int, sample: int) -> float:
    others = {node_id(i): None for i in range(n)}
    gang = [node_id(1), node_id(2), node_id(3)]
    began = time.perf_counter()
    for r in range(20):
        peers_to_probe(node_id(0), others, gang, sample, r)
    return round((time.perf_counter() - began) / 20 * 1e6, 1)


def out_segments() -> int:
    rows = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines() if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("OutSegs")])


async def segments_per_probe(pings: int, probes: int = 200) -> float:
    """TCP segments, both ways, of one ping-only probe (connect, pings, close): the fewest of 3 tries."""
    server = ProbeServer("127.10.255.1", 0)
    await server.start()
    best = math.inf
    try:
        for _ in range(3):
            before = out_segments()
            for _ in range(probes):
                async with ProbeClient(server.host, server.port, 2.0) as client:
                    await client.round_trips(pings)
            await asyncio.sleep(0.2)  # the closes' last segments
            best = min(best, (out_segments() - before) / probes)
    finally:
        await server.stop()
    return best


def one_size(args: argparse.Namespace, n: int, segments: float, logs: Path) -> dict[str, Any]:
    teams = gangs(n, args.gang_fraction)
    gang_avg = sum(len(t) * (len(t) - 1) for t in teams) / n
    interval_s = max(args.interval_s, n * (min(args.sample, n - 1) + gang_avg) / args.pace)
    with EmbeddedBroker(log_path=logs / f"broker-{n}.log") as broker:
        asyncio.run(ensure_topics(broker.bootstrap, [LINKS]))
        workers = Workers(args, n, interval_s, broker.bootstrap, free_port("127.10.0.1"), logs)
        try:
            workers.expect("ready")
            workers.send({"cmd": "form"})
            formed = workers.expect("formed")
            start = time.time() + 1.0
            workers.send({"cmd": "rounds", "start": start})
            reports = workers.expect("report")
            workers.send({"cmd": "stop"})
            cpu = summed(workers.expect("stopped"), "cpu_s")
        finally:
            workers.close()
        elapsed = max(r["ended"] for r in reports) - start
        published = summed(formed, "events") + summed(reports, "events")
        values, keys = asyncio.run(read_links(broker.bootstrap, published))
    topic = topic_figures(values, keys)

    probes, failed, sent = summed(reports, "probes"), summed(reports, "failed"), summed(reports, "bytes_sent")
    events, bursts, node_rounds = summed(reports, "events"), summed(reports, "bursts"), summed(reports, "rounds")
    burst_payload = bursts * args.burst_bytes
    ping_bytes = sent - burst_payload  # the pings (and the bursts' few header bytes): echoed as sent
    both_ways = sent + ping_bytes
    wire = both_ways + HEADER_BYTES * (segments * (probes - failed) + 1.5 * burst_payload / MSS)
    per_round = {
        "probes": probes / node_rounds,
        "payload_bytes_sent": sent / node_rounds,
        "wire_bytes_estimate": wire / node_rounds,
        "messages": events / node_rounds,
        "broker_bytes": events * topic["bytes_per_message"] / node_rounds,
        "bursts": bursts / node_rounds,
    }
    per_node = [row for r in reports for row in r["per_node"]]
    expected = [want for _, want in per_node]
    took, late = [t for r in reports for t in r["took"]], [t for r in reports for t in r["late"]]
    sample_probes = per_round["probes"] - gang_avg
    revisit_s = math.ceil((n - 1 - gang_avg) / DEFAULTS.sample) * DEFAULTS.interval_s
    bursts_at_defaults = sample_probes / math.ceil(DEFAULTS.burst_every_s / revisit_s)
    ping_per_probe = ping_bytes / max(1, probes - failed)  # this run's pings (as many as the agent's by default)
    default_round_bytes = per_round["probes"] * ping_per_probe + bursts_at_defaults * DEFAULTS.burst_bytes
    return {
        "nodes": n,
        "gangs": len(teams),
        "gang_peers_per_node_mean": round(gang_avg, 3),
        "formation": {
            "probes": summed(formed, "probes"),
            "failed": summed(formed, "failed"),
            "payload_bytes_sent": summed(formed, "bytes_sent"),
            "messages": summed(formed, "events"),
            "seconds": round(max(f["seconds"] for f in formed), 2),
            "gang_peers_still_owed": summed(formed, "owed_left"),
        },
        "rounds": {
            "node_rounds": node_rounds,
            "probes": probes,
            "failed": failed,
            "failed_fraction": round(failed / max(1, probes), 5),
            "payload_bytes_sent": sent,
            "messages": events,
            "bursts": bursts,
            "seconds": round(elapsed, 2),
            "interval_s": round(interval_s, 2),
            "nominal_seconds": round(args.rounds * interval_s, 2),
            "round_s_median": round(statistics.median(took), 3),
            "round_s_p90": round(sorted(took)[int(0.9 * (len(took) - 1))], 3),
            "round_start_late_s_median": round(statistics.median(late), 3),
            "round_start_late_s_max": round(max(late), 3),
            "endpoint_bytes_in": summed(reports, "server_bytes_in"),
        },
        "per_s_at_this_pace": {
            "probes": round(probes / elapsed, 1),
            "payload_bytes_sent": round(sent / elapsed),
            "wire_bytes_estimate": round(wire / elapsed),
            "messages": round(events / elapsed, 1),
        },
        "per_node_per_round": {k: round(v, 3) for k, v in per_round.items()},
        "probes_per_node_round_vs_promised": {
            "promised_k_plus_gang_mean": round(statistics.fmean(expected), 3),
            "measured_mean": round(statistics.fmean(p / args.rounds for p, _ in per_node), 3),
            "nodes_off_promise": sum(1 for probed, want in per_node if probed != want * args.rounds),
            "min_max_promised": [min(expected), max(expected)],
        },
        "per_node_per_s_at_defaults": {
            "settings": f"interval {DEFAULTS.interval_s} s, k {DEFAULTS.sample}, {DEFAULTS.pings} pings,"
            f" {DEFAULTS.burst_bytes} B bursts at most every {DEFAULTS.burst_every_s} s a link",
            "probes": round(per_round["probes"] / DEFAULTS.interval_s, 3),
            "messages": round(per_round["messages"] / DEFAULTS.interval_s, 3),
            "bursts": round(bursts_at_defaults / DEFAULTS.interval_s, 3),
            "payload_bytes_sent": round(default_round_bytes / DEFAULTS.interval_s),
            "why_bursts": f"a sample peer comes round again every {revisit_s:.0f} s; a burst is due each"
            f" {math.ceil(DEFAULTS.burst_every_s / revisit_s)} visits",
        },
        "cluster_per_s_at_defaults": {
            "probes": round(n * per_round["probes"] / DEFAULTS.interval_s, 1),
            "messages": round(n * per_round["messages"] / DEFAULTS.interval_s, 1),
            "broker_bytes": round(n * per_round["broker_bytes"] / DEFAULTS.interval_s),
            "payload_bytes_sent": round(n * default_round_bytes / DEFAULTS.interval_s),
        },
        "cpu": {
            "workers_cpu_s": round(cpu, 2),
            "ms_per_node_round": round(cpu / node_rounds * 1000, 3),
            "peers_to_probe_us": peers_to_probe_us(n, args.sample),
        },
        "topic_after_run": topic,
        "long_run": long_run(n, gang_avg, topic["bytes_per_message"]),
    }


def growth(results: list[dict[str, Any]], section: str, key: str) -> float:
    first, last = results[0][section][key], results[-1][section][key]
    return round(last / first, 3) if first else math.inf


def bench(args: argparse.Namespace) -> dict[str, Any]:
    sizes = sorted(int(part) for part in args.nodes.split(","))
    load_before = os.getloadavg()
    segments = asyncio.run(segments_per_probe(args.pings))
    with tempfile.TemporaryDirectory(prefix="shardyard-links-") as tmp:
        logs = Path(args.logs or tmp)
        logs.mkdir(parents=True, exist_ok=True)
        results = [one_size(args, n, segments, logs) for n in sizes]
    keys = ("probes", "payload_bytes_sent", "messages", "broker_bytes")
    per_node = {k: growth(results, "per_node_per_round", k) for k in keys}
    headline = max(per_node.values())
    worst_failed = max(r["rounds"]["failed_fraction"] for r in results)
    off_promise = sum(r["probes_per_node_round_vs_promised"]["nodes_off_promise"] for r in results)
    return {
        "bench": "link_probes",
        "settings": {
            "workers": args.workers,
            "rounds": args.rounds,
            "interval_s_at_least": args.interval_s,
            "pace_probes_per_s": args.pace,
            "k": args.sample,
            "pings": args.pings,
            "burst_bytes": args.burst_bytes,
            "probe_timeout_s": args.timeout_s,
            "timeout_note": f"the agent's is {DEFAULTS.timeout_s} s; here both ends of 1,000 nodes' probes share two"
            " cores with other work, whose stalls of a few seconds would fail probes a cluster would not",
            "burst_note": "bench bursts are smaller than the agent's 4 MiB default so 1,000 nodes fit this machine;"
            " per_node_per_s_at_defaults projects them at 4 MiB",
            "gang_fraction": args.gang_fraction,
            "gang_sizes": GANG_SIZES,
            "tcp_segments_per_ping_probe": segments,
            "cores": os.cpu_count(),
        },
        "load_before": load_before,
        "results": results,
        "per_node_growth": headline,
        "per_node_growth_by_figure": per_node,
        "cpu_per_node_round_growth": growth(results, "cpu", "ms_per_node_round"),
        "peers_to_probe_growth": growth(results, "cpu", "peers_to_probe_us"),
        "topic_keys_after_run_growth_per_node": round(
            results[-1]["topic_after_run"]["distinct_keys"]
            / sizes[-1]
            / (results[0]["topic_after_run"]["distinct_keys"] / sizes[0]),
            3,
        ),
        "targets": {
            "per_node_growth": TARGET_GROWTH,
            "failed_fraction": TARGET_FAILED,
            "nodes_off_promise": 0,
        },
        "all_targets_met": headline <= TARGET_GROWTH and worst_failed <= TARGET_FAILED and off_promise == 0,
        "load_after": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="100,300,1000", help="cluster sizes, comma-separated")
    parser.add_argument("--workers", type=int, default=4, help="processes the nodes are shared among")
    parser.add_argument("--rounds", type=int, default=3, help="probe rounds per node")
    parser.add_argument("--interval-s", type=float, default=2.0, help="seconds between a node's rounds, at least")
    parser.add_argument(
        "--pace",
        type=float,
        default=250.0,
        help="probes a second this machine is offered at most: a larger N gets a longer interval (per node per round"
        " nothing changes; an event loop that lags past the probes' 2 s timeout fails them)",
    )
    parser.add_argument("--sample", type=int, default=DEFAULTS.sample, help="k: peers a round beyond the gang")
    parser.add_argument("--pings", type=int, default=DEFAULTS.pings)
    parser.add_argument("--burst-bytes", type=int, default=64 * 1024)
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=10.0,
        help=f"a probe step's timeout (the agent's: {DEFAULTS.timeout_s} s; a shared machine stalls every process"
        " for seconds at times)",
    )
    parser.add_argument("--gang-fraction", type=float, default=0.5, help="share of the nodes in gangs")
    parser.add_argument("--logs", help="keep the workers' and brokers' logs here (failed probes logged)")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parse_args(parser, SMOKE)
    if args.worker is not None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("aiokafka").setLevel(logging.WARNING)
        asyncio.run(worker(args))
        return
    print(json.dumps(bench(args), indent=2))


if __name__ == "__main__":
    main()
