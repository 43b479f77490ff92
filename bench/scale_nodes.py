"""The simulated nodes of ``bench/scale.py``: one process heartbeats N 8-GPU A100 nodes at 1 Hz and answers their
assignments as their agents would. Run by ``scale.py``; it can run alone against any cluster:

    python bench/scale_nodes.py --bootstrap 127.0.0.1:PORT --nodes 1000 [--shard-s 3] [--max-s 600]

Heartbeats: node ``i`` beats in slice ``i % SLICES`` of every second (spread over the second as independent agents
are), in the codec's encoding, keyed by node id as ``key_of`` keys it. Only ``NodeBeats`` knows what a node sends:
the agent's full ``Heartbeat``, or, where the agent has ``shardyard.node_agent.beats``, what its ``Beats`` picks
(the full heartbeat on a change or a refresh, else the small ``NodeLease``). With ``--relay`` the process publishes
as a per-host relay would (``shardyard.events.NodeLeases``): each slice's leases go out as one record per heartbeats
partition, sealed as the relay; full heartbeats still go one a node.

Assignments: read from ``shardyard.assignments`` (no group, from the end) and judged by the agent's own
``AgentBook``: a launch is answered with ``ShardStarted`` at once and ``ShardCompleted`` ``--shard-s`` later (the
shard is in the node's heartbeats' ``running`` meanwhile); a spare is held; a revocation stops the shard (no end is
reported, as the agent reports none); a stop request ends it ``ShardPreempted``. A stopped node (``stop``) is dead: no
heartbeats, its shards end silently, its assignments are ignored.

Control (stdin, one JSON object a line): ``{"cmd": "mark"}`` answers the counters since the previous mark;
``{"cmd": "stop", "nodes": [...]}`` stops those nodes and answers their last heartbeats' wall-clock times;
``{"cmd": "exit"}`` (or stdin closing, or ``--max-s``) ends it. Answers are JSON lines on stdout; the first is
``{"event": "ready"}``, once the producer runs and the assignment reader sits at the topic's end.
"""

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from shardyard.bus.codec import decode, encode, key_of
from shardyard.bus.seal import AGENT, Keys, Seal, screen
from shardyard.bus.topics import ASSIGNMENTS, HEARTBEATS, SHARD_EVENTS, partition_of
from shardyard.cluster_secret import secret_from_env
from shardyard.errors import EventDecodeError
from shardyard.events import Heartbeat, RunningShard, ShardAssignment, ShardRevocation, ShardStarted, ShardStopRequest
from shardyard.node_agent.book import AgentBook, ShardKey, Verdict
from shardyard.node_agent.inventory import SimulatedGpus
from shardyard.training.exitcodes import OK, PREEMPTED

SLICES = 20
GPUS = "A100:8"
CPU_CORES = 128.0
MEMORY_BYTES = 1024**4
MODEL_PATH = "/data/models/gpt2_pretrained"
DATASET_PATH = "/data/datasets/wikitext"
ARTIFACTS = {MODEL_PATH: "shared", DATASET_PATH: "shared"}
"""Every simulated node reports both as present on the shared mount (``--shared-mounts /data``), whether or not a live
job names them: the agent reports only watched paths, so here they are never what a job waits for."""
Message = tuple[str, bytes, bytes]
"""(topic, key, value)"""

try:  # the agent's own choice of full heartbeat or lease, beat by beat (absent before the lease protocol)
    from shardyard.events import lease_of
    from shardyard.node_agent.beats import Beats as AgentBeats
except ImportError:
    AgentBeats = None  # type: ignore[assignment,misc]
try:  # a relay's batch of leases (absent before relays)
    from shardyard.bus.seal import RELAY
    from shardyard.events import NodeLeases
    from shardyard.events.node import MAX_RELAYED_LEASES
except ImportError:
    NodeLeases = None  # type: ignore[assignment,misc]
RELAY_NAME = "scale-sim"

_EID = "e" * 32  # the length of an event id (uuid4 hex)
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_SEQ = 987654321987
_verified = 0
_relay_verified = 0
_pids = itertools.count(100_000)


def stamp(now: datetime) -> bytes:
    """``now`` as the codec writes a UTC datetime."""
    return now.isoformat().replace("+00:00", "Z").encode()


def template(event: Any) -> bytes:
    """``event`` encoded by the codec, with ``%s`` / ``%s`` / ``%d`` holes for its event id, time and seq (it must
    carry the marker values ``_EID``, ``_EPOCH``, ``_SEQ``)."""
    global _verified
    raw = encode(event).replace(b"%", b"%%")
    marks = (f'"event_id":"{_EID}"', f'"occurred_at":"{stamp(_EPOCH).decode()}"', f'"seq":{_SEQ},')
    for mark, hole in zip(marks, ('"event_id":"%s"', '"occurred_at":"%s"', '"seq":%d,'), strict=True):
        if raw.count(mark.encode()) != 1:
            raise SystemExit(f"the {event.type} encoding changed: {mark} is not in it once; fix scale_nodes.template")
        raw = raw.replace(mark.encode(), hole.encode())
    if _verified < 6:  # a splice must decode to exactly what the codec would have encoded
        _verified += 1
        now = datetime.now(UTC)
        want = event.model_copy(update={"event_id": "f" * 32, "occurred_at": now, "seq": 7})
        if decode(HEARTBEATS, raw % (b"f" * 32, stamp(now), 7)) != want:
            raise SystemExit(f"a spliced {event.type} does not decode to the event it stands for; fix the template")
    return raw


def relay_record(leases: list[tuple[bytes, bytes]], now: bytes) -> tuple[bytes, bytes]:
    """(key, value) of one relayed record of ``leases`` ((key, encoded lease) of nodes of one partition), keyed by
    its first node as ``NodeLeases`` is."""
    global _relay_verified
    key = leases[0][0]
    value = b"".join(
        (
            b'{"event_id":"%s","occurred_at":"%s","schema_version":1,"type":"node.leases","relay":"%s","node_id":"%s",'
            % (os.urandom(16).hex().encode(), now, RELAY_NAME.encode(), key),
            b'"leases":[',
            b",".join(lease for _key, lease in leases),
            b"]}",
        )
    )
    if _relay_verified < 3:  # the record must decode to the leases it carries
        _relay_verified += 1
        event = decode(HEARTBEATS, value)
        if not isinstance(event, NodeLeases) or [lease.node_id.encode() for lease in event.leases] != [
            k for k, _ in leases
        ]:
            raise SystemExit("a relayed record does not decode to the leases it carries; fix scale_nodes.relay_record")
    return key, value


class NodeBeats:
    """What one node sends each second. With the agent's ``shardyard.node_agent.beats`` (the lease protocol), its
    ``Beats`` decides, as in the agent: the full heartbeat when the inventory changed or is due for a refresh, else
    the lease; without it, the full heartbeat every time. Both are encoded once per change of the node's shards;
    each beat splices a fresh event id, the sending time and the next seq into them."""

    def __init__(self, node_id: str, instance: str, data_root: str) -> None:
        self.node_id = node_id
        self.key = node_id.encode()
        self.seq = 0
        self.policy = AgentBeats() if AgentBeats is not None else None
        self.base = Heartbeat(
            occurred_at=_EPOCH,
            event_id=_EID,
            node_id=node_id,
            agent_instance=instance,
            seq=_SEQ,
            host="127.0.0.1",
            address="127.0.0.1",
            rendezvous_ports=(29500, 50),
            gpus=(),
            cpu_cores=CPU_CORES,
            memory_bytes=MEMORY_BYTES,
            cpu_load=0.0,
            mounts={"/data": data_root},
            artifacts=ARTIFACTS,
        )
        self.current = self.base
        self.full = self.lease = b""
        self.update((), SimulatedGpus([GPUS]).probe({}))

    @property
    def encoder(self) -> str:
        return "agent Beats (full heartbeat or lease), spliced templates" if self.policy else "full heartbeat, spliced"

    def update(self, running: tuple[RunningShard, ...], gpus: Iterable[Any]) -> None:
        """The node's shards or GPUs changed."""
        self.current = self.base.model_copy(update={"running": running, "gpus": tuple(gpus)})
        self.full = template(self.current)
        if self.policy is not None:
            self.lease = template(lease_of(self.current).model_copy(update={"event_id": _EID}))

    def next(self, now: bytes) -> tuple[bool, Message]:
        """This node's beat for this second, and whether it is a lease; ``now`` is ``stamp(sending time)``."""
        self.seq += 1
        chosen = self.full
        if self.policy is not None:
            mono = time.monotonic()
            if not hasattr(self.policy, "full_due"):  # an agent from before Beats.full_due
                full = isinstance(self.policy.next(self.current, mono), Heartbeat)
            else:
                full = self.policy.full_due(self.current, mono)
            if full:
                self.policy.delivered(self.current, mono)  # taken as delivered once handed over (the agent awaits)
            else:
                chosen = self.lease
        return chosen is self.lease, (
            HEARTBEATS.name,
            self.key,
            chosen % (os.urandom(16).hex().encode(), now, self.seq),
        )


class SimNode:
    """One node: its beats and the agent's book of its assignments."""

    def __init__(self, node_id: str, data_root: str) -> None:
        self.id = node_id
        self.partition = partition_of(node_id, HEARTBEATS)
        self.beats = NodeBeats(node_id, f"{node_id}-{int(time.time())}", data_root)
        self.book = AgentBook(node_id)
        self.gpus = SimulatedGpus([GPUS])
        self.timers: dict[ShardKey, asyncio.TimerHandle] = {}
        self.pids: dict[ShardKey, int] = {}
        """a made-up process id per running shard, as its ShardStarted and the heartbeats' ``running`` give it"""
        self.alive = True
        self.last_beat = 0.0

    def changed(self) -> None:
        self.beats.update(self.book.running_shards(self.pids), self.gpus.probe(self.book.gpu_utilization()))


class Nodes:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.nodes = [SimNode(f"sim-{i:05d}", args.data_root) for i in range(args.nodes)]
        self.by_id = {node.id: node for node in self.nodes}
        self.counts = {"sent": 0, "beats": 0, "send_errors": 0, "assignments": 0, "started": 0, "completed": 0}
        self.counts |= {"revoked": 0, "preempted": 0, "spares": 0, "ignored_dead": 0, "undecodable": 0, "refused": 0}
        self.late_ms_max = 0.0
        self.pending: set[asyncio.Future[Any]] = set()
        options: dict[str, Any] = {
            "bootstrap_servers": args.bootstrap,
            "enable_idempotence": False,
            "acks": "all",  # as the agents' producer
            "linger_ms": args.linger_ms,
            "max_batch_size": 256 * 1024,
            "max_request_size": 4 * 1024 * 1024,
        }
        self.producer = AIOKafkaProducer(**options)
        """Shard events."""
        self.beats_options = options
        """The beats' own producer, made in their own thread (``beats_thread``)."""
        self.done = asyncio.Event()
        self.stopping = threading.Event()
        self.beat_lock = threading.Lock()
        secret = secret_from_env()
        self.keys = None if secret is None else Keys(secret)
        """With the cluster's secret (``--sign-events``): each node seals what it sends with its agent's key, and
        what it is assigned is checked, as an agent does (``shardyard.bus.seal``)."""
        self.checker = None if secret is None else Seal(Keys(secret), "", "")

    def sealed(self, node_id: str, topic: str, key: bytes, value: bytes) -> list[tuple[str, bytes]] | None:
        return self.sealed_by(AGENT, node_id, topic, key, value)

    def sealed_by(self, role: str, name: str, topic: str, key: bytes, value: bytes) -> list[tuple[str, bytes]] | None:
        if self.keys is None:
            return None
        headers = Seal(self.keys, role, name).headers(topic, key, value)
        return [(name, text.encode()) for name, text in headers.items()]

    def _sent(self, futures: list[asyncio.Future[Any]]) -> None:
        batch = asyncio.ensure_future(asyncio.gather(*futures, return_exceptions=True))
        self.pending.add(batch)

        def settled(done: asyncio.Future[Any]) -> None:
            self.pending.discard(done)
            self.counts["send_errors"] += sum(isinstance(r, BaseException) for r in done.result())

        batch.add_done_callback(settled)

    def beats_thread(self) -> threading.Thread:
        """Heartbeats and leases, apart from everything else: in a thread of their own, with their own event loop and
        producer. A burst of thousands of assignments answered at once kept the one loop busy for seconds, and every
        node went SUSPECT while its beats waited (a real agent's beat waits on no other node's); a thread gets the
        interpreter back every few milliseconds (``sys.getswitchinterval``) whatever the other is doing."""
        thread = threading.Thread(target=lambda: asyncio.run(self.beat()), name="beats", daemon=True)
        thread.start()
        return thread

    async def beat(self) -> None:
        loop = asyncio.get_running_loop()
        self.beats_producer = AIOKafkaProducer(**self.beats_options)
        await self.beats_producer.start()
        try:
            await self._beat(loop)
        finally:
            await self.beats_producer.stop()  # flushes what was handed over

    async def _beat(self, loop: asyncio.AbstractEventLoop) -> None:
        next_at, tick = loop.time(), 0
        while not self.stopping.is_set():
            late = (loop.time() - next_at) * 1000
            self.late_ms_max = max(self.late_ms_max, late)
            if late > 500:
                print(f"{time.time():.1f} beat tick {tick} late {late:.0f} ms", file=sys.stderr, flush=True)
            wall = time.time()
            now = stamp(datetime.fromtimestamp(wall, UTC))
            with self.beat_lock:  # a stop waits for the slice being sent: its nodes' last beats are then known
                futures = []
                relayed: dict[int, list[tuple[bytes, bytes]]] = {}
                for node in self.nodes[tick % SLICES :: SLICES]:
                    if not node.alive:
                        continue
                    lease, (topic, key, value) = node.beats.next(now)
                    if lease and self.args.relay:
                        relayed.setdefault(node.partition, []).append((key, value))
                    else:
                        headers = self.sealed(node.id, topic, key, value)
                        futures.append(await self.beats_producer.send(topic, value, key=key, headers=headers))
                    node.last_beat = wall
                self.counts["beats"] += len(futures) + sum(map(len, relayed.values()))
                for leases in relayed.values():
                    for first in range(0, len(leases), MAX_RELAYED_LEASES):
                        key, value = relay_record(leases[first : first + MAX_RELAYED_LEASES], now)
                        headers = self.sealed_by(RELAY, RELAY_NAME, HEARTBEATS.name, key, value)
                        futures.append(await self.beats_producer.send(HEARTBEATS.name, value, key=key, headers=headers))
            self.counts["sent"] += len(futures)
            self._beats_sent(futures)
            took = time.time() - wall
            if took > 0.5:
                print(f"{time.time():.1f} beat tick {tick} took {took * 1000:.0f} ms", file=sys.stderr, flush=True)
            tick += 1
            next_at += 1.0 / SLICES
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    def _beats_sent(self, futures: list[asyncio.Future[Any]]) -> None:
        def settled(done: asyncio.Future[Any]) -> None:
            self.counts["send_errors"] += sum(isinstance(r, BaseException) for r in done.result())

        asyncio.ensure_future(asyncio.gather(*futures, return_exceptions=True)).add_done_callback(settled)

    async def publish(self, events: list[Any]) -> None:
        futures = []
        for event in events:
            key, value = key_of(event), encode(event)
            headers = self.sealed(event.node_id, SHARD_EVENTS.name, key, value)
            futures.append(await self.producer.send(SHARD_EVENTS.name, value, key=key, headers=headers))
        self._sent(futures)

    async def answer(self, consumer: AIOKafkaConsumer) -> None:
        while not self.done.is_set():
            batches = await consumer.getmany(timeout_ms=100, max_records=2000)
            events = []
            for records in batches.values():
                for record in records:
                    try:
                        event = decode(ASSIGNMENTS, record.value or b"")
                    except EventDecodeError:
                        self.counts["undecodable"] += 1
                        continue
                    raw = record.value or b""
                    if screen(self.checker, ASSIGNMENTS.name, record.key, raw, record.headers, event) is not None:
                        self.counts["refused"] += 1
                        continue
                    events.extend(self.on_assignment(event))
                    if len(events) % 200 == 199:
                        await asyncio.sleep(0)  # the beats go on while a burst of assignments is answered
            if events:
                await self.publish(events)

    def on_assignment(self, event: object) -> list[Any]:
        node = self.by_id.get(getattr(event, "node_id", ""))
        if node is None:
            return []
        if not node.alive:
            self.counts["ignored_dead"] += 1
            return []
        now = datetime.now(UTC)
        if isinstance(event, ShardRevocation):
            key = node.book.on_revocation(event)
            if key is None:
                return []
            self.counts["revoked"] += 1
            return self._end(node, key, -15, None)
        if isinstance(event, ShardStopRequest):
            key = node.book.on_stop_request(event)
            if key is None:
                return []
            self.counts["preempted"] += 1
            return self._end(node, key, PREEMPTED, {"kind": "preempted", "step": None})
        if not isinstance(event, ShardAssignment):
            return []
        self.counts["assignments"] += 1
        verdict = node.book.on_assignment(event)
        if verdict is Verdict.HOLD_SPARE:
            self.counts["spares"] += 1
        if verdict is not Verdict.LAUNCH:
            return []
        key = (event.job_id, event.shard_index, event.attempt)
        self.counts["started"] += 1
        node.pids[key] = next(_pids)
        node.changed()
        loop = asyncio.get_running_loop()
        node.timers[key] = loop.call_later(self.args.shard_s, self._complete, node, key, event.workload.max_steps)
        started = ShardStarted(
            occurred_at=now, job_id=key[0], shard_index=key[1], attempt=key[2], node_id=node.id, pid=node.pids[key]
        )
        return [started]

    def _complete(self, node: SimNode, key: ShardKey, steps: int) -> None:
        if node.alive and key in node.book.running:
            self.counts["completed"] += 1
            final = {"kind": "finished", "final_loss": 1.0, "steps": steps}
            task = asyncio.ensure_future(self.publish(self._end(node, key, OK, final)))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)

    def _end(self, node: SimNode, key: ShardKey, code: int, final: dict[str, Any] | None) -> list[Any]:
        """The shard's process exited with ``code``: what the agent reports (nothing for a revoked one)."""
        timer = node.timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        node.pids.pop(key, None)
        event = node.book.finished(key, code, now=datetime.now(UTC), final=final, message=f"exit code {code}")
        node.changed()
        return [event] if event is not None else []

    def stop(self, ids: list[str]) -> dict[str, float]:
        last = {}
        for node_id in ids:
            node = self.by_id[node_id]
            with self.beat_lock:
                node.alive = False
            for timer in node.timers.values():
                timer.cancel()
            last[node_id] = node.last_beat
        return last

    def mark(self) -> dict[str, Any]:
        times = os.times()
        out = {**self.counts, "cpu_s": times.user + times.system, "tick_late_ms_max": round(self.late_ms_max, 1)}
        self.late_ms_max = 0.0
        return out


def say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def control(nodes: Nodes) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while not nodes.done.is_set():
        line = await reader.readline()
        if not line:
            break
        command = json.loads(line)
        if command["cmd"] == "mark":
            say({"event": "mark", **nodes.mark()})
        elif command["cmd"] == "stop":
            say({"event": "stopped", "last_beat": nodes.stop(command["nodes"])})
        elif command["cmd"] == "exit":
            break
    nodes.done.set()


async def run(args: argparse.Namespace) -> None:
    nodes = Nodes(args)
    consumer = AIOKafkaConsumer(ASSIGNMENTS.name, bootstrap_servers=args.bootstrap, auto_offset_reset="latest")
    await nodes.producer.start()
    await consumer.start()
    try:
        await consumer.seek_to_end()
        for tp in consumer.assignment():
            await consumer.position(tp)  # resolved now: no assignment after "ready" is missed
        say({"event": "ready", "nodes": len(nodes.nodes), "encoder": nodes.nodes[0].beats.encoder})
        beats = nodes.beats_thread()
        tasks = [asyncio.create_task(c) for c in (nodes.answer(consumer), control(nodes))]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(nodes.done.wait(), args.max_s)
        nodes.done.set()
        nodes.stopping.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(beats.join, 10)
        if nodes.pending:
            await asyncio.wait(nodes.pending, timeout=5)
        say({"event": "report", **nodes.mark()})
    finally:
        nodes.stopping.set()
        await consumer.stop()
        await nodes.producer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--data-root", default="/tmp/shardyard-scale-data")
    parser.add_argument("--shard-s", type=float, default=3.0, help="how long a shard runs before it completes")
    parser.add_argument("--linger-ms", type=int, default=10)
    parser.add_argument("--max-s", type=float, default=900.0, help="exit after this long whatever happens")
    parser.add_argument(
        "--relay", action="store_true", help="publish leases as a per-host relay would: one record a partition a slice"
    )
    args = parser.parse_args()
    if args.relay and NodeLeases is None:
        raise SystemExit("--relay: this Shardyard has no relayed leases (shardyard.events.NodeLeases)")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
