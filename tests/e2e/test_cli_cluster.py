"""End to end through the CLI: a real local cluster of separate processes on a real broker."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shardyard.cli.cluster import ClusterInfo, get_json
from shardyard.training.artifacts import create_demo_artifacts

pytestmark = [pytest.mark.slow, pytest.mark.broker]
ROOT = Path(__file__).parents[2]
EXAMPLE = json.loads((ROOT / "examples" / "fine_tune_gpt2.json").read_text())


def cli(
    *args: str, run_dir: Path, stdin: bytes | None = None, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardyard.cli.main", "--run-dir", str(run_dir), *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env if env is not None else {**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def job(task_id: str, **training: int) -> bytes:
    document = json.loads(json.dumps(EXAMPLE))
    document["task_id"] = task_id
    if training:
        document["training"] = training
        document["sync_interval"] = 10
    return json.dumps(document).encode()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    run_dir = tmp_path_factory.mktemp("cluster")
    create_demo_artifacts(run_dir / "data")
    started = cli("up", run_dir=run_dir, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield run_dir
    finally:
        stopped = cli("down", run_dir=run_dir, timeout=120)
        assert stopped.returncode == 0, stopped.stderr


def status(run_dir: Path, job_id: str) -> dict[str, object]:
    shown = cli("status", job_id, "--json", run_dir=run_dir)
    assert shown.returncode == 0, shown.stderr
    return dict(json.loads(shown.stdout))


def test_the_s15_example_runs_to_success(cluster: Path) -> None:
    submitted = cli("submit", str(ROOT / "examples" / "fine_tune_gpt2.json"), "--wait", run_dir=cluster)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    view = status(cluster, "fine_tune_gpt2")
    assert view["state"] == "SUCCEEDED"
    placements = view["placements"]
    assert isinstance(placements, list) and {p["gpu_model"] for p in placements} == {"A100"}
    shards = view["shards"]
    assert isinstance(shards, dict) and all(s["syncs"] >= 3 for s in shards.values())
    assert float(view["final_loss"]) < float(view["first_loss"])  # type: ignore[arg-type]
    timeline = cli("status", "fine_tune_gpt2", run_dir=cluster).stdout
    for event in ("accepted", "scheduled", "running", "parameter sync", "succeeded"):
        assert event in timeline


BAD = {
    "bad-json": (b"{this is not json", "MALFORMED_JSON"),
    "e2e-missing": (
        json.dumps({k: v for k, v in json.loads(job("e2e-missing")).items() if k != "dependencies"}).encode(),
        "MISSING_FIELD",
    ),
}


def test_bad_input_is_rejected_with_a_reason_and_the_queue_goes_on(cluster: Path) -> None:
    ids = {}
    for name, (raw, _reason) in BAD.items():
        out = cli("submit", "-", run_dir=cluster, stdin=raw)
        assert out.returncode == 0, out.stderr
        ids[name] = out.stdout.split()[1]
    wrong = json.loads(job("e2e-wrong-type"))
    wrong["resource_requirements"]["gpu"]["count"] = "two"
    zero = json.loads(job("e2e-zero"))
    zero["resource_requirements"]["gpu"]["count"] = 0
    del zero["shard_count"]
    unknown = json.loads(job("e2e-unknown-model"))
    unknown["resource_requirements"]["gpu"] = {"count": 2, "model": "Z900"}
    for document in (wrong, zero, unknown):
        assert cli("submit", "-", run_dir=cluster, stdin=json.dumps(document).encode()).returncode == 0
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
    listing = cli("status", run_dir=cluster).stdout
    assert "e2e-unknown-model" in listing and "UNKNOWN_GPU_MODEL" in listing


def kcat_speaks_to(bootstrap: str) -> str | None:
    """None when kcat can talk to the broker, else why not."""
    if shutil.which("kcat") is None:
        return "kcat (Debian package) is not installed"
    probe = subprocess.run(["kcat", "-L", "-b", bootstrap, "-m", "5"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        # librdkafka 2.0 (Debian 12's kcat) cannot parse the embedded Tansu 0.6 broker's ApiVersions v3 reply
        # ("Read underflow"); against Apache Kafka (testcontainers or SHARDYARD_KAFKA_BOOTSTRAP) kcat runs.
        return f"kcat cannot talk to this broker: {probe.stderr.strip().splitlines()[-1]}"
    return None


def produce_with_kcat(bootstrap: str, task_id: str) -> None:
    produced = subprocess.run(
        ["kcat", "-P", "-b", bootstrap, "-t", "shardyard.jobs.submissions", "-k", task_id],
        input=job(task_id, max_steps=30),
        capture_output=True,
        timeout=30,
    )
    assert produced.returncode == 0, produced.stderr


def produce_with_kafka_python(bootstrap: str, task_id: str) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        producer.send("shardyard.jobs.submissions", job(task_id, max_steps=30), key=task_id.encode()).get(timeout=30)
    finally:
        producer.close()


def wait_for_end(run_dir: Path, job_id: str, timeout_s: float = 180) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    view: dict[str, object] = {}
    while time.monotonic() < deadline:
        shown = cli("status", job_id, "--json", run_dir=run_dir)
        if shown.returncode == 0:
            view = json.loads(shown.stdout)
            if view["state"] in ("SUCCEEDED", "FAILED", "REJECTED"):
                return view
        time.sleep(0.5)
    return view


def test_kcat_submits_like_the_cli(cluster: Path) -> None:
    bootstrap = ClusterInfo.load(cluster).bootstrap
    why_not = kcat_speaks_to(bootstrap)
    if why_not:
        pytest.skip(why_not)
    produce_with_kcat(bootstrap, "kcat-job")
    assert wait_for_end(cluster, "kcat-job").get("state") == "SUCCEEDED"


def test_an_independent_kafka_client_submits_like_the_cli(cluster: Path) -> None:
    """kafka-python shares no code with Shardyard's aiokafka producer: plain JSON on the topic is all it takes."""
    produce_with_kafka_python(ClusterInfo.load(cluster).bootstrap, "kafka-python-job")
    view = wait_for_end(cluster, "kafka-python-job")
    assert view.get("state") == "SUCCEEDED", view


S7_METRICS = {
    # S7 item -> (metric family, labels a sample must carry; "{job}" stands for the running job's id)
    "job state": ("shardyard_jobs", {"state": "RUNNING"}),
    "training step": ("shardyard_shard_step", {"job": "{job}"}),
    "loss": ("shardyard_shard_loss", {"job": "{job}"}),
    "GPU utilisation": ("shardyard_gpu_utilization_ratio", {}),
    "GPU memory (resource use)": ("shardyard_gpu_memory_used_bytes", {}),
    "CPU utilisation": ("shardyard_shard_cpu_ratio", {"job": "{job}"}),
    "node CPU load": ("shardyard_node_cpu_load_ratio", {}),
    "data-transfer rate (bytes)": ("shardyard_allreduce_bytes", {"job": "{job}"}),
    "data-transfer rate (seconds)": ("shardyard_allreduce_seconds", {"job": "{job}"}),
    "AllReduce time": ("shardyard_allreduce_last_seconds", {"job": "{job}"}),
    "network latency": ("shardyard_node_mean_rtt_seconds", {}),
    "node health": ("shardyard_node_status", {"status": "ALIVE"}),
    "throughput": ("shardyard_shard_samples_per_second", {"job": "{job}"}),
}


def test_a_running_job_shows_every_s7_metric(cluster: Path) -> None:
    submitted = cli("submit", "-", run_dir=cluster, stdin=job("s7-metrics", max_steps=20000, batch_size=2))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    info = ClusterInfo.load(cluster).live()
    deadline = time.monotonic() + 180
    while True:
        try:
            found = get_json(f"{info.monitor_url}/api/jobs/s7-metrics")
        except urllib.error.URLError:  # 404 until the monitor has seen the job accepted
            found = {}
        if found.get("state") == "RUNNING" and all(s.get("syncs", 0) >= 1 for s in found["shards"].values()):
            break
        assert time.monotonic() < deadline, f"s7-metrics did not sync in time: {found.get('state')}"
        time.sleep(0.25)
    with urllib.request.urlopen(f"{info.monitor_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    missing = []
    for item, (name, wanted) in S7_METRICS.items():
        labels = {k: v.replace("{job}", "s7-metrics") for k, v in wanted.items()}
        if not any(
            s.name.removesuffix("_total") == name and all(s.labels.get(k) == v for k, v in labels.items())
            for s in samples
        ):
            missing.append(f"{item}: {name}{labels}")
    assert missing == [], missing
    cancelled = cli("cancel", "s7-metrics", run_dir=cluster)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
