"""Forged events against a real cluster that seals its events (``shardyard up --sign-events``; ``shardyard.bus.seal``)
and takes only signed submissions. With a plain Kafka producer, as anyone who reaches the broker could, the test
forges: a cancel of a running job, a drain of a node, a heartbeat of a fake node, a ``shard.completed`` of the
running job (and the same sealed with the key of an agent that does not run that shard), an assignment of a job
nobody submitted under a term of 10^12, a leader announcement, a replay of the running job's signed submission, and
a cancel signed by another team.

Each is refused: dead-lettered with its reason (``x-shardyard-forged``) or, for the replay, answered ``REJECTED
REPLAYED``; the state is unchanged (the job runs on and its shards stay where they were, the node takes shards, no
fake node, no shard of the forged job, the leader is the real one); ``FORGED_EVENTS`` fires for each topic; and
then a cancel by the job's own team (signed, through the queue) and one by the operator (sealed) take effect."""

import asyncio
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardyard.bus.codec import encode, key_of, topic_of
from shardyard.bus.replay import replay
from shardyard.bus.seal import AGENT, FORGED_HEADER, Keys, Seal
from shardyard.bus.topics import ASSIGNMENTS, CATALOGUE, DEADLETTER, HEARTBEATS, SUBMISSIONS
from shardyard.bus.transport import client_options
from shardyard.cli.client import signature
from shardyard.cli.cluster import ClusterInfo, get_json
from shardyard.cli.cluster_info import ADMIN_PRINCIPAL
from shardyard.cluster_secret import read_secret
from shardyard.events import (
    Event,
    Heartbeat,
    JobCancelRequested,
    LeaderElected,
    NodeDrain,
    ShardAssignment,
    ShardCompleted,
)
from shardyard.training.artifacts import create_demo_artifacts
from tests.e2e.test_placement_e2e import document, until
from tests.support import wait
from tests.support.cluster import ONE_REPLICA, cli, speaking_as
from tests.support.events import Producer, read_log

pytestmark = [pytest.mark.slow, pytest.mark.broker]

A_KEY, B_KEY = "a1" * 32, "b1" * 32
TEAM_B = f"  team-b:\n    keys:\n      k1: {{secret: {B_KEY}}}\n"
CREDENTIALS = f"teams:\n  team-a:\n    keys:\n      k1: {{secret: {A_KEY}}}\n{TEAM_B}"
ONLY_B = "teams:\n" + TEAM_B
"""What team B's user holds: its own key only."""
FORGED_ON = {
    "shardyard.jobs.lifecycle",
    "shardyard.nodes.heartbeats",
    "shardyard.shards.events",
    "shardyard.assignments",
    "shardyard.services",
}
"""The topics the forgeries go to: FORGED_EVENTS fires for each."""


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ClusterInfo]]:
    run_dir = tmp_path_factory.mktemp("sealed")
    create_demo_artifacts(run_dir / "data")
    credentials = run_dir / "credentials.yaml"
    credentials.write_text(CREDENTIALS)
    credentials.chmod(0o600)
    started = cli(
        "up", *ONE_REPLICA, "--node", "A100:1", "--node", "A100:1", "--sign-events",
        "--credentials-file", str(credentials), run_dir=run_dir, timeout=180,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        with speaking_as(ClusterInfo.load(run_dir), ADMIN_PRINCIPAL):  # the attacker has the broker's keys
            yield run_dir, ClusterInfo.load(run_dir)
    finally:
        cli("down", run_dir=run_dir, timeout=120)


def newest(bootstrap: str, kind: type[Event], **fields: Any) -> Any:
    found: list[Any] = []

    def keep(_topic: object, event: object) -> None:
        if isinstance(event, kind) and all(getattr(event, k) == v for k, v in fields.items()):
            found.append(event)

    asyncio.run(replay(bootstrap, [topic_of_kind(kind)], keep))
    return found[-1] if found else None


def topic_of_kind(kind: type[Event]) -> Any:
    return {Heartbeat: HEARTBEATS, ShardAssignment: ASSIGNMENTS}[kind]


def forged_letters(bootstrap: str) -> dict[str, set[str]]:
    """Source topic -> the reasons its events were refused for, from the dead-letter topic."""
    from aiokafka import AIOKafkaConsumer

    async def read() -> dict[str, set[str]]:
        consumer = AIOKafkaConsumer(
            DEADLETTER.name, bootstrap_servers=bootstrap, auto_offset_reset="earliest", **client_options()
        )
        await consumer.start()
        try:
            batches = await consumer.getmany(timeout_ms=2000)
        finally:
            await consumer.stop()
        reasons: dict[str, set[str]] = {}
        for records in batches.values():
            for record in records:
                headers = {name: value.decode() for name, value in record.headers or ()}
                if FORGED_HEADER in headers:
                    source = headers["x-shardyard-source"].rsplit("/", 2)[0]
                    reasons.setdefault(source, set()).add(headers[FORGED_HEADER])
        return reasons

    return asyncio.run(read())


async def forge(bootstrap: str, events: list[tuple[Event, list[tuple[str, bytes]] | None]]) -> None:
    async with Producer(bootstrap) as send:
        for event, headers in events:
            await send.raw(topic_of(event).name, encode(event), key=key_of(event), headers=headers)


def agent_sealed(secret_file: str, node_id: str, event: Event) -> list[tuple[str, bytes]]:
    """``event`` sealed with the key of ``node_id``'s agent (what a compromised agent could send)."""
    seal = Seal(Keys(read_secret(Path(secret_file))), AGENT, node_id)
    return [(n, v.encode()) for n, v in seal.headers(topic_of(event).name, key_of(event), encode(event)).items()]


@pytest.mark.timeout(600)
def test_each_forged_event_is_refused_and_the_cluster_goes_on_as_before(sealed: tuple[Path, ClusterInfo]) -> None:
    run_dir, info = sealed
    assert info.secret_file and Path(info.secret_file).stat().st_mode & 0o077 == 0
    victim = document("victim", shard_count=2, sync_interval=5, training={"max_steps": 100000, "batch_size": 2})
    victim["resource_requirements"]["gpu"]["count"] = 2
    raw = json.dumps({**victim, "queue": "team-a"}).encode()
    signed = signature(raw, str(run_dir / "credentials.yaml"))  # as `shardyard submit --credentials` signs
    asyncio.run(submission(info.bootstrap, raw, signed))
    running = until(run_dir, "victim", lambda j: j["state"] == "RUNNING" and (j.get("step") or 0) >= 10, 240)
    placed = {int(i): shard["node_id"] for i, shard in running["shards"].items()}
    assignment = newest(info.bootstrap, ShardAssignment, job_id="victim", shard_index=0)
    beat = newest(info.bootstrap, Heartbeat, node_id=placed[0])
    assert assignment is not None and beat is not None
    assert forged_letters(info.bootstrap) == {}  # a healthy sealed cluster refuses nothing of its own
    now, other = beat.occurred_at, placed[1]

    completed = ShardCompleted(
        occurred_at=now, job_id="victim", shard_index=0, attempt=assignment.attempt, node_id=placed[0],
        final_loss=0.0, steps=1, checkpoint_dir=None,
    )  # fmt: skip
    asyncio.run(
        forge(
            info.bootstrap,
            [
                (JobCancelRequested(occurred_at=now, job_id="victim", requested_by="mallory"), None),
                (NodeDrain(occurred_at=now, node_id=placed[0], draining=True), None),
                (beat.model_copy(update={"node_id": "node-mallory", "agent_instance": "mallory"}), None),
                (completed, None),
                (completed, agent_sealed(info.secret_file, other, completed)),  # not the node running shard 0
                (assignment.model_copy(update={"job_id": "mallory-job", "term": 10**12}), None),
                (LeaderElected(occurred_at=now, service="scheduler", instance="mallory", term=10**12), None),
            ],
        )
    )
    asyncio.run(submission(info.bootstrap, raw, signed))  # the same record again: a replay
    # Team B signs a cancel of team A's job with its own key (the CLI would not: it holds no key of team A).
    by_b = json.dumps({"cancel": "victim", "queue": "team-b"}).encode()
    team_b = run_dir / "team-b.yaml"
    team_b.write_text(ONLY_B)
    asyncio.run(submission(info.bootstrap, by_b, signature(by_b, str(team_b))))

    alerts = wait.until(
        lambda: forged_alerts(info) >= FORGED_ON or None,
        "FORGED_EVENTS for every topic forged on",
        90,
        every_s=1.0,
        describe=lambda: {"firing": sorted(forged_alerts(info)), "letters": forged_letters(info.bootstrap)},
    )
    assert alerts
    letters = forged_letters(info.bootstrap)
    assert letters.keys() >= FORGED_ON, letters
    assert "NOT_PERMITTED" in letters["shardyard.shards.events"], letters
    assert "UNSEALED" in letters["shardyard.jobs.lifecycle"], letters

    # Nothing forged took effect: the job trains on where it was, rejected once as a replay and nothing more.
    later = until(run_dir, "victim", lambda j: (j.get("step") or 0) >= (running.get("step") or 0) + 10, 120)
    assert later["state"] == "RUNNING", later
    assert {int(i): s["node_id"] for i, s in later["shards"].items()} == placed
    assert "REPLAYED" in json.dumps(later["timeline"]), later["timeline"]
    nodes = {n["node_id"]: n for n in get_json(f"{info.monitor_url}/api/nodes")["nodes"]}
    assert "node-mallory" not in nodes and not nodes[placed[0]].get("draining"), nodes
    leaders = get_json(f"{info.monitor_url}/api/services")["leaders"]
    assert leaders["scheduler"]["instance"] != "mallory", leaders
    assert newest(info.bootstrap, ShardAssignment, job_id="mallory-job") is not None  # it is on the bus, refused
    assert "mallory-job" not in json.dumps(get_json(f"{info.monitor_url}/api/jobs"))

    # The job's own team cancels it (signed with its key, through the queue); the operator cancels any job (sealed
    # by the CLI with the cluster's secret): both take effect.
    waiting = json.dumps({**victim, "task_id": "waiting", "queue": "team-a"}).encode()
    asyncio.run(submission(info.bootstrap, waiting, signature(waiting, str(run_dir / "credentials.yaml")), "waiting"))
    until(run_dir, "waiting", lambda j: j["state"] == "READY", 60)
    by_operator = cli("cancel", "waiting", run_dir=run_dir)
    assert by_operator.returncode == 0, by_operator.stdout + by_operator.stderr
    by_a = cli("cancel", "victim", "--credentials", str(run_dir / "credentials.yaml"), run_dir=run_dir)
    assert by_a.returncode == 0, by_a.stdout + by_a.stderr
    assert "team team-a" in json.dumps(until(run_dir, "victim", lambda j: j["state"] == "CANCELLED", 120))
    until(run_dir, "waiting", lambda j: j["state"] == "CANCELLED", 60)


def forged_alerts(info: ClusterInfo) -> set[str]:
    try:
        answer = get_json(f"{info.monitor_url}/api/alerts")
    except (OSError, ValueError):
        return set()
    return {a["subject"] for a in answer.get("firing", []) if a.get("rule") == "FORGED_EVENTS"}


async def submission(bootstrap: str, raw: bytes, headers: list[tuple[str, bytes]], job_id: str = "victim") -> None:
    async with Producer(bootstrap) as send:
        await send.raw(SUBMISSIONS.name, raw, key=job_id.encode(), headers=headers)


@pytest.mark.timeout(400)
def test_up_secures_a_cluster_with_a_local_key_and_the_readme_commands_still_run_the_example(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    run_dir = tmp_path_factory.mktemp("secure")
    create_demo_artifacts(run_dir / "data")
    started = cli("up", *ONE_REPLICA, "--node", "A100:1", "--node", "A100:1", run_dir=run_dir, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        info = ClusterInfo.load(run_dir)
        assert Path(info.credentials_file).stat().st_mode & 0o077 == 0 and info.secret_file
        example = Path(__file__).parents[2] / "examples" / "fine_tune_gpt2.json"
        done = cli("submit", str(example), "--wait", run_dir=run_dir, timeout=300)  # signed with the local key
        assert done.returncode == 0 and "SUCCEEDED" in done.stdout, done.stdout + done.stderr

        unsigned = json.dumps(document("unsigned")).encode()
        with speaking_as(info, info.submitter("default")):
            asyncio.run(submission(info.bootstrap, unsigned, [], "unsigned"))
        refused = until(run_dir, "unsigned", lambda j: j["state"] == "REJECTED", 60)
        assert "UNAUTHENTICATED" in json.dumps(refused), refused
    finally:
        cli("down", run_dir=run_dir, timeout=120)


SECRET_VALUE = "s3cret-value-42"


@pytest.mark.timeout(400)
def test_an_entrypoints_environment_reaches_its_shard_and_is_on_no_topic_in_the_clear(
    sealed: tuple[Path, ClusterInfo],
) -> None:
    run_dir, info = sealed
    digest = hashlib.sha256(SECRET_VALUE.encode()).hexdigest()  # the command names the value only by its digest
    check = (
        "import hashlib, os, sys; "
        f"sys.exit(0 if hashlib.sha256(os.environ.get('API_TOKEN', '').encode()).hexdigest() == {digest!r} else 3)"
    )
    job = document("with-secret", shard_count=1, sync_interval=5)
    job["resource_requirements"]["gpu"]["count"] = 1
    job.update(
        queue="team-a", entrypoint={"command": [sys.executable, "-c", check], "env": {"API_TOKEN": SECRET_VALUE}}
    )
    done = cli(
        "submit", "-", "--wait", "--timeout", "240", "--credentials", str(run_dir / "credentials.yaml"),
        run_dir=run_dir, stdin=json.dumps(job).encode(), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and "with-secret: SUCCEEDED" in done.stdout, done.stdout + done.stderr

    found = raw_records(info.bootstrap)
    assert any(b"with-secret" in value for value in found["shardyard.assignments"])  # read what was sent
    assert any(b"sy-enc:v1:team/team-a/k1:" in value for value in found["shardyard.jobs.submissions"])
    assert any(b"sy-enc:v1:agents:" in value for value in found["shardyard.jobs.lifecycle"])
    clear = sorted(topic for topic, values in found.items() if any(SECRET_VALUE.encode() in v for v in values))
    assert clear == [], clear
    shown = get_json(f"{info.monitor_url}/api/jobs/with-secret")["spec"]["entrypoint"]["env"]
    assert shown == {"API_TOKEN": "<redacted>"}


def raw_records(bootstrap: str) -> dict[str, list[bytes]]:
    """Every record's value on every topic of the catalogue, by topic (see :func:`read_log`)."""
    found: dict[str, list[bytes]] = {topic.name: [] for topic in CATALOGUE}
    for (topic, _partition, _offset), value in sorted(read_log(bootstrap).items()):
        found[topic].append(value)
    return found
