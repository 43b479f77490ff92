"""A flood of hostile submissions on a real local cluster (``shardyard up``: its Apache Kafka, every service twice,
three agents), with a few small valid jobs inside it, as a careless or hostile user would send them.

10,000 generated submissions go through the broker, keyed as ``shardyard submit`` keys them: truncated and non-JSON
bytes; documents of 0.3-10 MiB (Kafka refuses those over the topic's 1 MiB record limit at the door); documents nested
10,000 deep; wrong types, NaN and 2^70; unicode, NUL and HTML in ids; traversal paths and paths outside the mounts, a
5,000-character path; loader environment overrides and a ``working_dir`` of ``/proc/1/cwd``; schema-valid numbers of
10^400; valid jobs with bad signatures (an unknown key, a body changed after signing, expired, garbage credentials) or
none (the cluster is secured as ``up`` secures it, with no anonymous queue); and six small valid jobs signed with the
cluster's key, one of them sent twice.

Then, from the log and the monitor:

- every submission got exactly one answer: accepted, rejected with a typed reason, or dead-lettered with a reason;
  every badly signed or unsigned valid job is ``UNAUTHENTICATED``, the one sent twice ``REPLAYED``.
  A verdict carries an id derived from its submission's offset, so a verdict delivered twice (a queue replica thrown
  out of its group mid-batch publishes what its successor publishes again) is one answer; two different verdicts,
  or a verdict and a dead letter, for one submission are two;
- every valid job SUCCEEDED;
- no node was ever SUSPECT or LOST;
- once the flood drained, no GPU is reserved with nothing running;
- no service restarted, and the queue replicas' memory stayed bounded.

The drain time (first submission sent to last answer on the log) is printed.
"""

import asyncio
import contextlib
import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import MessageSizeTooLargeError

from shardyard.bus.codec import decode
from shardyard.bus.replay import replay
from shardyard.bus.topics import DEADLETTER, LIFECYCLE, NODE_STATE, SUBMISSIONS, Topic
from shardyard.bus.transport import client_options
from shardyard.cli.cluster import ClusterInfo, get_json
from shardyard.cli.cluster_info import ADMIN_PRINCIPAL
from shardyard.errors import EventDecodeError
from shardyard.events import JobAccepted, JobRejected, NodeState, NodeStatus, RejectReason
from shardyard.signing import AUTH_HEADER, SIGNATURE_HEADER, read_credentials, sign
from shardyard.training.artifacts import create_demo_artifacts
from tests.support.cluster import cli, speaking_as, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.chaos]

FLOOD = 10_000
VALID = 6
QUEUE_RSS_LIMIT_MIB = 400
MIB = 1024 * 1024
HUGE_MIB = (0.3, 0.6, 0.9, 2, 10)
SOURCE = "x-shardyard-source"
Message = tuple[bytes, list[tuple[str, bytes]]]
"""A submission's body and its Kafka headers."""
Key = tuple[str, str, str]
"""A team's signing key: team, key id, secret."""


def valid_job(index: int) -> dict[str, Any]:
    return {
        "task_id": f"valid-{index}",
        "resource_requirements": {"gpu": {"count": 1, "model": "A100", "min_flops": 35}, "memory": "1GiB"},
        "dependencies": {"pretrained_model": "/data/models/gpt2_pretrained", "dataset": "/data/datasets/wikitext"},
        "sync_interval": 5,
        "training": {"max_steps": 10, "batch_size": 2, "seed": index},
    }


def hostile(rng: random.Random, index: int) -> bytes:
    """One generated hostile submission: every class of the module docstring, in proportions, none of them valid."""
    base = valid_job(0) | {"task_id": f"hostile-{index}"}
    kind = index % 10  # 9: forged (floods)
    if kind == 0:  # truncated JSON, random bytes, not UTF-8
        whole = json.dumps(base).encode()
        return rng.choice([whole[: rng.randrange(1, len(whole) - 1)], rng.randbytes(rng.randrange(1, 300)), b"\xff"])
    if kind == 1:  # wrong types, NaN, 2^70
        field_name, value = rng.choice(
            [
                ("priority", "high"),
                ("priority", float("nan")),
                ("priority", 2**70),
                ("sync_interval", float("inf")),
                ("resource_requirements", []),
                ("shard_count", True),
                ("depends_on", "parent"),
            ]
        )
        return json.dumps(base | {field_name: value}).encode()
    if kind == 2:  # ids: unicode, NUL, HTML, too long
        bad_id = rng.choice(["j\u00f6b", "a\x00b", "<script>alert(1)</script>", "x" * 300, "", "../../etc"])
        return json.dumps(base | {"task_id": bad_id}).encode()
    if kind == 3:  # paths: traversal, outside the mounts, too long
        path = rng.choice(["../../etc", "/etc/passwd", "/data/../../etc", "/data/" + "p" * 5000, "relative/x"])
        return json.dumps(base | {"dependencies": {"pretrained_model": path, "dataset": path}}).encode()
    if kind == 4:  # environment overrides, a working_dir outside the mounts
        entrypoint = rng.choice(
            [
                {"command": ["python", "-c", "0"], "env": {"LD_PRELOAD": "/tmp/evil.so"}},
                {"command": ["python", "-c", "0"], "env": {"PATH": "/tmp"}},
                {"command": ["python", "-c", "0"], "env": {"PYTHONPATH": "/tmp"}},
                {"command": ["python", "-c", "0"], "working_dir": "/proc/1/cwd"},
            ]
        )
        return json.dumps(base | {"entrypoint": entrypoint}).encode()
    if kind == 5:  # schema-valid shapes with numbers of 10^400
        training = {"seed": 10**400} if rng.random() < 0.5 else {"max_steps": 10**400}
        if rng.random() < 0.3:
            return json.dumps(base | {"resource_requirements": {"gpu": {"count": 1}, "memory": 10**400}}).encode()
        return json.dumps(base | {"training": training}).encode()
    if kind == 6:  # unknown fields, many of them
        return json.dumps(base | {f"extra_{i}": i for i in range(rng.randrange(1, 200))}).encode()
    if kind == 7:
        return json.dumps(base | {"resource_requirements": {"gpu": {"count": 0}}}).encode()  # out of range
    return json.dumps(base | {"task_id": f"unsigned-{index}"}).encode()  # valid, but a secured cluster's queue
    # takes no unsigned submission


def forged(rng: random.Random, index: int, key: Key) -> Message:
    """A valid job, badly signed: an unknown key, a body changed after signing, expired, or garbage credentials."""
    raw = json.dumps(valid_job(0) | {"task_id": f"forged-{index}"}).encode()
    team, key_id, secret = key
    kind = rng.randrange(4)
    if kind == 0:
        return raw, sign(raw, team=team, key_id="k-unknown", secret=secret, now_s=time.time())
    if kind == 1:
        return raw.replace(b'"seed": 0', b'"seed": 1'), sign(
            raw, team=team, key_id=key_id, secret=secret, now_s=time.time()
        )
    if kind == 2:
        return raw, sign(raw, team=team, key_id=key_id, secret=secret, now_s=time.time() - 3600)
    return raw, [(AUTH_HEADER, rng.randbytes(rng.randrange(1, 200))), (SIGNATURE_HEADER, rng.randbytes(64))]


def floods(key: Key) -> list[Message]:
    """The flood: FLOOD messages, each a body and its headers (the valid jobs' signatures, the forged ones')."""
    rng = random.Random(16)
    messages: list[Message] = []
    for i in range(FLOOD - VALID - 26):
        messages.append(forged(rng, i, key) if i % 10 == 9 else (hostile(rng, i), []))
    # Over the queue's limit (256 KiB): the first three reach the queue, which refuses them TOO_LARGE; the last two
    # are over the submissions topic's record limit too (1 MiB), and Apache Kafka refuses them at the door.
    messages += [(b'{"task_id": "huge", "pad": "' + b"x" * int(size * MIB) + b'"}', []) for size in HUGE_MIB]
    messages += [(b'{"task_id": "deep", "x": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", []) for _ in range(20)]
    step = len(messages) // (VALID + 1)
    team, key_id, secret = key
    for index in range(VALID):  # spread through the flood
        raw = json.dumps(valid_job(index)).encode()
        messages.insert(
            (index + 1) * step, (raw, sign(raw, team=team, key_id=key_id, secret=secret, now_s=time.time()))
        )
    replayed = messages[2 * step]  # valid-1, sent again later: the same signature
    assert replayed[0].startswith(b'{"task_id": "valid-1"')
    messages.insert(4 * step, replayed)
    assert len(messages) == FLOOD
    return messages


def key_of(raw: bytes) -> bytes | None:
    """The key ``shardyard submit`` gives a submission: its ``task_id``, when it has one."""
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    task_id = document.get("task_id") if isinstance(document, dict) else None
    return task_id.encode(errors="surrogatepass") if isinstance(task_id, str) else None


async def produce(bootstrap: str, messages: list[Message]) -> list[str | None]:
    """Send every message, pipelined; returns the source (topic/partition/offset) of each, None for one the broker
    refused as too large (``MessageSizeTooLargeError``: it never entered the log)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=False,
        max_request_size=16 * MIB,
        **client_options(),
    )
    await producer.start()
    try:
        futures = [
            await producer.send(SUBMISSIONS.name, raw, key=key_of(raw), headers=headers) for raw, headers in messages
        ]
        sent = await asyncio.gather(*futures, return_exceptions=True)
    finally:
        await producer.stop()
    for meta in sent:
        if isinstance(meta, BaseException) and not isinstance(meta, MessageSizeTooLargeError):
            raise meta
    return [
        None if isinstance(meta, BaseException) else f"{SUBMISSIONS.name}/{meta.partition}/{meta.offset}"
        for meta in sent
    ]


@dataclass
class Answers:
    """Every answer to a submission on the log, read as it comes by a consumer on its own thread: acceptances and
    rejections on the lifecycle topic (by ``source_offset``), dead letters by their source header."""

    bootstrap: str
    by_source: dict[str, list[str]] = field(default_factory=dict)
    """Submission source -> every answer naming it (``accepted``, ``rejected:REASON``, ``dead-letter:ERROR``)."""
    rejected: Counter[str] = field(default_factory=Counter)
    last_answer_at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> "Answers":
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def answered(self) -> set[str]:
        with self._lock:
            return set(self.by_source)

    async def _run(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=16 * MIB,
            **client_options(),
        )
        await consumer.start()
        try:
            partitions = [
                TopicPartition(topic.name, p) for topic in (LIFECYCLE, DEADLETTER) for p in range(topic.partitions)
            ]
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            while not self._stop.is_set():
                for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                    for record in records:
                        self._take(tp.topic, record.value or b"", dict(record.headers or ()))
        finally:
            await consumer.stop()

    def _take(self, topic: str, raw: bytes, headers: dict[str, bytes]) -> None:
        if topic == DEADLETTER.name:
            source = headers.get(SOURCE, b"").decode()
            if source.startswith(SUBMISSIONS.name):
                self._add(source, f"dead-letter:{headers.get('x-shardyard-error', b'').decode()[:80]}")
            return
        try:
            event = decode(LIFECYCLE, raw)
        except EventDecodeError:
            return
        if isinstance(event, JobAccepted):
            self._add(event.source_offset, f"accepted#{event.event_id}")
        elif isinstance(event, JobRejected):
            self._add(event.source_offset, f"rejected:{event.reason}#{event.event_id}")

    def _add(self, source: str, answer: str) -> None:
        with self._lock:
            self.by_source.setdefault(source, []).append(answer)
            if answer.startswith("rejected:") and answer not in self.by_source[source][:-1]:
                self.rejected[answer.split(":", 1)[1].split("#")[0]] += 1
            self.last_answer_at = time.monotonic()


def node_statuses(bootstrap: str) -> Counter[tuple[str, NodeStatus]]:
    seen: Counter[tuple[str, NodeStatus]] = Counter()

    def apply(_topic: Topic, event: Any) -> None:
        if isinstance(event, NodeState):
            seen[(event.node_id, event.status)] += 1

    asyncio.run(replay(bootstrap, [NODE_STATE], apply))
    return seen


@dataclass
class MemoryWatch:
    """The resident memory of some processes, sampled every 0.5 s: the largest seen, per process."""

    pids: dict[str, int]
    peak_mib: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> "MemoryWatch":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                with contextlib.suppress(OSError, ValueError):
                    status = Path(f"/proc/{pid}/status").read_text()
                    rss_kib = int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])
                    self.peak_mib[name] = max(self.peak_mib.get(name, 0.0), rss_kib / 1024)
            self._stop.wait(0.5)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    run_dir = tmp_path_factory.mktemp("hostile")
    create_demo_artifacts(run_dir / "data")
    started = cli("up", run_dir=run_dir, timeout=240)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        with speaking_as(ClusterInfo.load(run_dir), ADMIN_PRINCIPAL):  # this process's Kafka clients
            yield run_dir
    finally:
        for pid in ClusterInfo.load(run_dir).pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        cli("down", run_dir=run_dir, timeout=180)


def unanswered(sources: list[str], messages: list[Message], answered: set[str]) -> str:
    """How many submissions have no answer yet, and the first few of them."""
    missing = [(source, message) for source, message in zip(sources, messages, strict=True) if source not in answered]
    shown = [f"{source}: {raw[:60]!r} {[name for name, _ in headers]}" for source, (raw, headers) in missing[:5]]
    return f"{len(missing)} submissions unanswered, such as {shown}"


@pytest.mark.timeout(900)
def test_a_flood_of_hostile_submissions_is_answered_and_harms_nobody(cluster: Path) -> None:
    info = ClusterInfo.load(cluster)
    assert info.credentials_file and info.secret_file, "up secures a cluster by default"
    team = "default"
    key_id, secret = read_credentials(Path(info.credentials_file)).key(team)
    messages = floods((team, key_id, secret))
    refused = (b'{"task_id": "forged-', b'{"task_id": "unsigned-')
    unauthenticated = sum(1 for raw, _headers in messages if raw.startswith(refused))
    queues = {name: pid for name, pid in info.pids.items() if name.startswith("queue-")}

    with MemoryWatch(queues) as memory, Answers(info.bootstrap) as found:
        began = time.monotonic()
        produced = asyncio.run(produce(info.bootstrap, messages))
        sent_s = time.monotonic() - began
        at_the_door = produced.count(None)
        sources = [source for source in produced if source is not None]
        messages = [message for message, source in zip(messages, produced, strict=True) if source is not None]
        expected = set(sources)
        wait_for(
            "an answer to every submission",
            lambda: expected <= found.answered(),
            600,
            lambda: unanswered(sources, messages, found.answered()),
        )
        drained_s = found.last_answer_at - began
        print(f"\nhostile flood: {FLOOD} sent in {sent_s:.1f} s, all answered {drained_s:.1f} s after the first")

        def succeeded() -> dict[str, str] | None:
            listing = get_json(f"{info.live().monitor_url}/api/jobs", timeout_s=3)["jobs"]
            states = {j["job_id"]: j["state"] for j in listing if j["job_id"].startswith("valid-")}
            return states if len(states) == VALID and set(states.values()) == {"SUCCEEDED"} else None

        wait_for("every valid job SUCCEEDED", succeeded, 300, lambda: get_json(f"{info.live().monitor_url}/api/jobs"))

    answered = {source: found.by_source[source] for source in expected}  # the reader has stopped
    twice = {source: given for source, given in answered.items() if len(set(given)) != 1}
    assert not twice, f"answered more than once: {list(twice.items())[:5]}"
    outcomes = Counter(given[0].split(":")[0].split("#")[0] for given in answered.values())
    redelivered = sum(1 for given in answered.values() if len(given) > 1)
    print(f"answers: {dict(outcomes)}; rejections by reason: {dict(found.rejected)}; delivered twice: {redelivered}")
    assert outcomes["accepted"] == VALID, outcomes
    for reason in (RejectReason.TOO_LARGE, RejectReason.TOO_DEEP, RejectReason.MALFORMED_JSON):
        assert found.rejected[reason] > 0, f"no {reason} among {dict(found.rejected)}"
    # Apache Kafka refuses the two records over the topic's limit at the door; a broker that took them (the embedded
    # one has no limit) leaves them to the queue.
    assert at_the_door == (2 if info.broker == "kafka" else 0)
    assert found.rejected[RejectReason.TOO_LARGE] + at_the_door == len(HUGE_MIB)
    assert found.rejected[RejectReason.UNAUTHENTICATED] == unauthenticated > 1000, dict(found.rejected)
    assert found.rejected[RejectReason.REPLAYED] == 1, dict(found.rejected)
    assert found.rejected[RejectReason.TOO_DEEP] == 20

    statuses = node_statuses(info.bootstrap)
    misjudged = {key: count for key, count in statuses.items() if key[1] is not NodeStatus.ALIVE}
    assert not misjudged, f"nodes misjudged during the flood: {misjudged}"

    def nothing_reserved() -> list[dict[str, Any]] | None:
        nodes = get_json(f"{info.live().monitor_url}/api/nodes", timeout_s=3)["nodes"]
        held = [n for n in nodes if n.get("allocated_gpus") and not n.get("running")]
        return nodes if not held and len(nodes) == 3 else None

    wait_for("no GPU reserved with nothing running", nothing_reserved, 60)

    restarted = [name for name, pid in info.pids.items() if not alive(pid)]
    assert not restarted, f"processes died during the flood: {restarted}"
    print(f"queue peak RSS (MiB): {memory.peak_mib}")
    assert memory.peak_mib and max(memory.peak_mib.values()) < QUEUE_RSS_LIMIT_MIB, memory.peak_mib
