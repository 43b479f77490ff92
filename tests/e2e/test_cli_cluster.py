"""End to end through the CLI: a real local cluster of separate processes on a real broker."""

import getpass
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardyard.bus.transport import CA_FILE_ENV, MECHANISM_ENV, PASSWORD_FILE_ENV, PROTOCOL_ENV, USERNAME_ENV
from shardyard.cli.cluster import ClusterInfo
from tests.support import wait
from tests.support.cluster import EXAMPLE, ROOT, cli, job, local_cluster

pytestmark = [pytest.mark.slow, pytest.mark.broker]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # secured as up secures it; unsigned JSON (kcat, kafka-python) goes into the default queue only
    options = ("--anonymous-queue", "default")
    # A job no set of nodes could hold ends UNSCHEDULABLE after 20 s here (an hour by default).
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SHARDYARD_UNSCHEDULABLE_AFTER_S": "20"}
    with local_cluster(tmp_path_factory.mktemp("cluster"), replicas=1, options=options, env=env) as run_dir:
        yield run_dir


def status(run_dir: Path, job_id: str) -> dict[str, object]:
    shown = cli("status", job_id, "--json", run_dir=run_dir)
    assert shown.returncode == 0, shown.stderr
    return dict(json.loads(shown.stdout))


def test_the_s15_example_runs_to_success(cluster: Path) -> None:
    submitted = cli("submit", str(ROOT / "examples" / "fine_tune_gpt2.json"), "--wait", run_dir=cluster)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    view = status(cluster, EXAMPLE["task_id"])
    assert view["state"] == "SUCCEEDED"
    placements = view["placements"]
    assert isinstance(placements, list) and {p["gpu_model"] for p in placements} == {"A100"}
    shards = view["shards"]
    assert isinstance(shards, dict) and all(s["syncs"] >= 3 for s in shards.values())
    assert float(view["final_loss"]) < float(view["first_loss"])  # type: ignore[arg-type]
    timeline = cli("status", EXAMPLE["task_id"], run_dir=cluster).stdout
    for event in ("accepted", "scheduled", "running", "parameter sync", "succeeded"):
        assert event in timeline
    # Its model and dataset were there from the start: it never waited for them, nor was told it did.
    assert "WAITING_FOR_ARTIFACT" not in timeline and "put it at" not in submitted.stdout + timeline, timeline
    assert (view["owner"], view["queue"]) == (getpass.getuser(), "default")  # `submit` named the local user

    listed = cli("jobs", run_dir=cluster).stdout.splitlines()
    row = next(line.split() for line in listed if line.startswith(EXAMPLE["task_id"] + " "))
    assert listed[0].split()[:4] == ["JOB", "STATE", "OWNER", "QUEUE"]
    assert row[:4] == [EXAMPLE["task_id"], "SUCCEEDED", getpass.getuser(), "default"]
    assert re.fullmatch(r"\d+s|\d+m\d\ds", row[-1]), row  # ELAPSED: its run time
    summary = cli("status", run_dir=cluster).stdout
    for line in (r"^nodes: +\d ALIVE", r"^scheduler leader: scheduler-\d", r"^  A100 +2 ", r"^jobs: +.*SUCCEEDED"):
        assert re.search(line, summary, re.MULTILINE), summary
    counts = json.loads(cli("status", "-o", "json", run_dir=cluster).stdout)["gpu_models"]
    assert set(counts) == {"A100", "V100"} and counts["A100"]["gpus"] == 2


BAD = {
    "bad-json": (b"{this is not json", "MALFORMED_JSON"),
    "e2e-missing": (
        json.dumps({k: v for k, v in json.loads(job("e2e-missing")).items() if k != "dependencies"}).encode(),
        "MISSING_FIELD",
    ),
}


def test_bad_input_is_rejected_with_a_reason_and_the_queue_goes_on(cluster: Path) -> None:
    ids = {}
    for name, (raw, reason) in BAD.items():
        checked = cli("submit", "-", run_dir=cluster, stdin=raw)  # the CLI's own check refuses it, naming why
        assert checked.returncode == 2 and f"REJECTED {reason}" in checked.stderr, checked.stdout + checked.stderr
        out = cli("submit", "-", "--no-check", run_dir=cluster, stdin=raw)  # the cluster's answer to it
        assert out.returncode == 2 and f": {reason}: " in out.stderr, out.stdout + out.stderr  # the queue's verdict
        ids[name] = out.stdout.split()[1]
    wrong = json.loads(job("e2e-wrong-type"))
    wrong["resource_requirements"]["gpu"]["count"] = "two"
    zero = json.loads(job("e2e-zero"))
    zero["resource_requirements"]["gpu"]["count"] = 0
    del zero["shard_count"]
    unknown = json.loads(job("e2e-unknown-model"))
    unknown["resource_requirements"]["gpu"] = {"count": 2, "model": "Z900"}
    for document in (wrong, zero, unknown):
        produced = cli("submit", "-", "--no-check", run_dir=cluster, stdin=json.dumps(document).encode())
        assert produced.returncode == 2 and "rejected " in produced.stderr, produced.stdout + produced.stderr
    good = cli("submit", "-", "--wait", run_dir=cluster, stdin=job("e2e-after-bad", max_steps=30), timeout=300)
    assert good.returncode == 0, good.stdout + good.stderr

    expected = {
        ids["bad-json"]: "MALFORMED_JSON",
        "e2e-missing": "MISSING_FIELD",
        "e2e-wrong-type": "WRONG_TYPE",
        "e2e-zero": "INVALID_VALUE",
        "e2e-unknown-model": "UNKNOWN_GPU_MODEL",
    }
    for job_id, reason in expected.items():
        view = status(cluster, job_id)
        assert (view["state"], view["reason"]) == ("REJECTED", reason), view
        shown = cli("status", job_id, run_dir=cluster).stdout
        assert reason in shown
    listing = cli("jobs", run_dir=cluster).stdout
    assert "e2e-unknown-model" in listing and "UNKNOWN_GPU_MODEL" in listing


def test_submit_answers_with_the_queues_verdict_and_a_duplicate_names_the_way_out(cluster: Path) -> None:
    raw = job("e2e-verdict", max_steps=30)
    first = cli("submit", "-", run_dir=cluster, stdin=raw)
    assert first.returncode == 0 and "accepted e2e-verdict into queue default" in first.stdout, first.stderr

    again = cli("submit", "-", run_dir=cluster, stdin=raw)  # the first thing everyone does: the same file again
    assert again.returncode == 2, again.stdout + again.stderr
    assert "rejected e2e-verdict: DUPLICATE_JOB" in again.stderr and "--new-id" in again.stderr, again.stderr

    renamed = cli("submit", "-", "--new-id", run_dir=cluster, stdin=raw)
    assert renamed.returncode == 0, renamed.stdout + renamed.stderr
    new_id = renamed.stdout.split()[1]
    assert re.fullmatch(r"e2e-verdict-[0-9a-f]{6}", new_id) and f"accepted {new_id}" in renamed.stdout

    written = cli("submit", "-", "--no-verdict", run_dir=cluster, stdin=raw)  # fire and forget, as before
    assert written.returncode == 0 and "accepted" not in written.stdout, written.stdout + written.stderr


def test_a_job_that_can_never_fit_is_told_so_and_neither_it_nor_the_wait_lasts_for_ever(cluster: Path) -> None:
    """The user's first try: the seed's job as 64 x H100 on a cluster of A100s and V100s."""
    document = json.loads(job("e2e-64-h100"))
    document["resource_requirements"]["gpu"] = {"count": 64, "model": "H100"}
    document["shard_count"] = 64
    began = time.monotonic()

    waited = cli("submit", "-", "--wait", "--wait-timeout", "3", run_dir=cluster, stdin=json.dumps(document).encode())

    took = time.monotonic() - began
    assert waited.returncode == 3, waited.stdout + waited.stderr
    assert "accepted e2e-64-h100" in waited.stdout
    said = waited.stderr
    assert "NEVER_FITS" in said and "could ever hold the gang of 64 x H100" in said, said
    assert "the cluster's GPUs: 2 x A100, 2 x V100" in said and "shardyard cancel e2e-64-h100" in said, said
    assert took < 30, took  # the reason comes at the first cycle; the wait gives up 3 s later
    assert status(cluster, "e2e-64-h100")["reason"] == "NEVER_FITS"
    ended = wait_for_end(cluster, "e2e-64-h100", timeout_s=60)  # the cluster's bound: 20 s
    assert (ended["state"], ended["reason"]) == ("FAILED", "UNSCHEDULABLE"), ended
    assert "never fitted this cluster in 20s" in str(ended["message"])


def credentials(info: ClusterInfo) -> dict[str, str]:
    """The SASL/TLS settings (librdkafka's names) an outside client needs to write submissions to ``info``'s broker
    as the default queue's team, as a user given that team's password file would (none for a plain broker)."""
    env = info.transport(info.submitter("default"))
    if not env:
        return {}
    return {
        "security.protocol": env[PROTOCOL_ENV],
        "sasl.mechanisms": env[MECHANISM_ENV],
        "sasl.username": env[USERNAME_ENV],
        "sasl.password": Path(env[PASSWORD_FILE_ENV]).read_text().strip(),
        "ssl.ca.location": env[CA_FILE_ENV],
    }


def kcat_args(info: ClusterInfo) -> list[str]:
    return ["-b", info.bootstrap, *(arg for item in credentials(info).items() for arg in ("-X", "=".join(item)))]


def kcat_speaks_to(info: ClusterInfo) -> str | None:
    """None when kcat can talk to the broker, else why not."""
    if shutil.which("kcat") is None:
        return "kcat (Debian package) is not installed"
    probe = subprocess.run(["kcat", "-L", *kcat_args(info), "-m", "5"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        # librdkafka 2.0 (Debian 12's kcat) cannot parse the embedded Tansu 0.6 broker's ApiVersions v3 reply ("Read
        # underflow"; Tansu-only), and fails SCRAM against Kafka 4 brokers (librdkafka before 2.6.1: edenhill/kcat#462;
        # the secured cluster's); a plain Apache Kafka it speaks to
        return f"kcat cannot talk to this broker: {probe.stderr.strip().splitlines()[-1]}"
    return None


def produce_with_kcat(info: ClusterInfo, task_id: str) -> None:
    produced = subprocess.run(
        ["kcat", "-P", *kcat_args(info), "-t", "shardyard.jobs.submissions", "-k", task_id],
        input=job(task_id, max_steps=30),
        capture_output=True,
        timeout=30,
    )
    assert produced.returncode == 0, produced.stderr


def produce_with_kafka_python(info: ClusterInfo, task_id: str, queue: str | None = None) -> None:
    from kafka import KafkaProducer

    raw = job(task_id, max_steps=30)
    if queue is not None:
        raw = json.dumps(json.loads(raw) | {"queue": queue}).encode()
    found = credentials(info)
    security = (
        {
            "security_protocol": found["security.protocol"],
            "sasl_mechanism": found["sasl.mechanisms"],
            "sasl_plain_username": found["sasl.username"],
            "sasl_plain_password": found["sasl.password"],
            "ssl_cafile": found["ssl.ca.location"],
        }
        if found
        else {}
    )
    producer = KafkaProducer(bootstrap_servers=info.bootstrap, acks="all", **security)
    try:
        producer.send("shardyard.jobs.submissions", raw, key=task_id.encode()).get(timeout=30)
    finally:
        producer.close()


def wait_for_end(run_dir: Path, job_id: str, timeout_s: float = 180) -> dict[str, object]:
    def ended() -> dict[str, object] | None:
        shown = cli("status", job_id, "--json", run_dir=run_dir)
        view: dict[str, object] = json.loads(shown.stdout) if shown.returncode == 0 else {}
        return view if view.get("state") in ("SUCCEEDED", "FAILED", "REJECTED") else None

    return wait.until(ended, f"{job_id} to end", timeout_s, every_s=0.5)


def test_kcat_submits_like_the_cli(cluster: Path) -> None:
    info = ClusterInfo.load(cluster)
    why_not = kcat_speaks_to(info)
    if why_not:
        pytest.skip(why_not)
    produce_with_kcat(info, "kcat-job")
    assert wait_for_end(cluster, "kcat-job").get("state") == "SUCCEEDED"


def test_an_independent_kafka_client_submits_like_the_cli(cluster: Path) -> None:
    """kafka-python shares no code with Shardyard's aiokafka producer: plain JSON on the topic is all it takes, into
    the cluster's anonymous queue; into another queue it is refused (``UNAUTHENTICATED``)."""
    produce_with_kafka_python(ClusterInfo.load(cluster), "kafka-python-job")
    view = wait_for_end(cluster, "kafka-python-job")
    assert view.get("state") == "SUCCEEDED", view
    produce_with_kafka_python(ClusterInfo.load(cluster), "kafka-python-elsewhere", queue="team-x")
    refused = wait_for_end(cluster, "kafka-python-elsewhere")
    assert refused.get("state") == "REJECTED" and "UNAUTHENTICATED" in json.dumps(refused), refused
    # The rejection names the ways out: sign with the team's key (where a local cluster keeps it), or the queue
    # that takes unsigned jobs.
    said = str(refused.get("message"))
    assert "credentials.yaml" in said and "submit it unsigned to queue 'default'" in said, said
