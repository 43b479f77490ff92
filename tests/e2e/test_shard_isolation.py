"""Shards are isolated end to end (issue "one bad job must not take down the cluster"): on a real local cluster
(real broker, services, agents running as root), two jobs' own scripts run at once, each as a user of its job's own.
Where this Python lies under a directory other users may not search (a pyenv in a 0700 ``/root``), the cluster runs
in a private mount namespace where that directory reads as searchable (``searchable_namespace``), so the agents run
their shards as the jobs' users as they would on a machine with a shared Python.
Job B looks for job A's process by the marker on its command line and cannot read its environment (A's token), nor
A's output directory. A third job prints its token and fails: the failure the status API serves says ``***``, never
the token, though the shard's log (the agent's, mode 0600) keeps what was printed."""

import json
import os
import stat
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardyard.cli.cluster import ClusterInfo, get_json
from shardyard.cli.rundir import shard_log_dir
from shardyard.node_agent.shard_users import DEFAULT_UID_BASE, DEFAULT_UID_COUNT
from tests.e2e.test_placement_e2e import submit, until
from tests.support.cluster import ONE_REPLICA, ROOT, cli, searchable_namespace, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.broker,
    pytest.mark.skipif(os.geteuid() != 0, reason="agents that are not root cannot run shards as other users"),
]

SECRET = "hf_secret_value_123"
MARKER = "shardyard-isolation-marker-a"
SHARD_UIDS = range(DEFAULT_UID_BASE, DEFAULT_UID_BASE + DEFAULT_UID_COUNT)

# Job A: leaves a file in its output directory, then waits (up to a deadline) for the test to let it end.
SCRIPT_A = """
import os, pathlib, sys, time
_marker, release = sys.argv[1:3]
(pathlib.Path(os.environ["SHARDYARD_OUTPUT_DIR"]) / "private.txt").write_text("job A's own")
deadline = time.monotonic() + 300
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.2)
sys.exit(0 if os.path.exists(release) else 1)
"""

# Job B: finds job A's processes by A's marker (given in B's environment, not its command line) and tries A's
# environment and output; records what each attempt raised in its own output directory.
SCRIPT_B = """
import json, os, pathlib, sys, time

def outcome(attempt):
    try:
        attempt()
        return "read"
    except OSError as exc:
        return type(exc).__name__

marker, a_output = os.environ["A_MARKER"].encode(), sys.argv[1]
deadline, found = time.monotonic() + 60, []
while not found and time.monotonic() < deadline:
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\\0")
            uid = os.stat(f"/proc/{entry}").st_uid
        except OSError:
            continue
        if marker in argv:
            found.append((int(entry), uid))
    time.sleep(0.2)
result = {
    "uid": os.getuid(),
    "a": [
        {"pid": pid, "uid": uid, "environ": outcome(lambda: pathlib.Path(f"/proc/{pid}/environ").read_bytes())}
        for pid, uid in found
    ],
    "listdir": outcome(lambda: os.listdir(a_output)),
    "read": outcome(lambda: pathlib.Path(a_output, "private.txt").read_text()),
}
(pathlib.Path(os.environ["SHARDYARD_OUTPUT_DIR"]) / "result.json").write_text(json.dumps(result))
"""

# Job C: prints its own token and fails (a user error: not retried).
SCRIPT_C = """
import os, sys
print(f"connecting with token {os.environ['HF_TOKEN']}", file=sys.stderr, flush=True)
sys.exit(3)
"""


def entry_job(task_id: str, model: str, command: list[str], env: dict[str, str]) -> dict[str, Any]:
    """``examples/ddp_job.json`` as a one-shard job of ``command`` (run with this interpreter) and ``env``."""
    document: dict[str, Any] = json.loads((ROOT / "examples" / "ddp_job.json").read_text())
    document["task_id"] = task_id
    document["resource_requirements"]["gpu"] = {"count": 1, "model": model}
    document["shard_count"] = 1
    document["entrypoint"] = {"command": [sys.executable, *command], "env": {"PYTHONHASHSEED": "0", **env}}
    return document


def ended(job: dict[str, Any]) -> bool:
    return job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The default local cluster (two A100 nodes, a V100:2 node) in a run folder its shards' users can reach."""
    run_dir = tmp_path_factory.mktemp("isolation")  # cli("up") makes it reachable
    for artifact in ("models/gpt2_pretrained", "datasets/wikitext"):  # the example's dependencies: any directories
        (run_dir / "data" / artifact).mkdir(parents=True)
    scripts = run_dir / "scripts"
    scripts.mkdir()
    for name, text in (("a.py", SCRIPT_A), ("b.py", SCRIPT_B), ("c.py", SCRIPT_C)):
        (scripts / name).write_text(textwrap.dedent(text))
    prefix = searchable_namespace(run_dir / ".closed-view")
    if prefix is None:
        pytest.skip("other users cannot run this Python, and no private mount namespace can be made to let them")
    env = {name: value for name, value in os.environ.items() if name != "SHARDYARD_SHARD_USER"}  # the default: job
    started = cli("up", *ONE_REPLICA, run_dir=run_dir, timeout=180, env={**env, "PYTHONUNBUFFERED": "1"}, prefix=prefix)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "shards run as root" not in started.stdout, started.stdout
    try:
        yield run_dir
    finally:
        cli("down", run_dir=run_dir, timeout=120)


def owner_and_mode(path: Path) -> tuple[int, int]:
    found = os.stat(path)
    return found.st_uid, stat.S_IMODE(found.st_mode)


@pytest.mark.timeout(600)
def test_a_job_cannot_read_another_jobs_environment_or_output(cluster: Path) -> None:
    scripts, release = cluster / "scripts", cluster / "release-a"
    a_output = cluster / "data" / "checkpoints" / "iso-a"
    submit(cluster, entry_job("iso-a", "A100", [str(scripts / "a.py"), MARKER, str(release)], {"HF_TOKEN": SECRET}))
    wait_for("job A's file in its output", lambda: (a_output / "private.txt").is_file(), 240)
    a_uid, a_mode = owner_and_mode(a_output)
    assert a_uid in SHARD_UIDS and a_mode == 0o700

    submit(cluster, entry_job("iso-b", "A100", [str(scripts / "b.py"), str(a_output)], {"A_MARKER": MARKER}))
    b_done = until(cluster, "iso-b", ended, 240)
    assert b_done["state"] == "SUCCEEDED", json.dumps(b_done["timeline"][-6:])
    result = json.loads((cluster / "data" / "checkpoints" / "iso-b" / "result.json").read_text())
    release.touch()  # job A may end now

    assert result["uid"] in SHARD_UIDS and result["uid"] != a_uid
    assert result["a"], "job B found none of job A's processes"
    assert {seen["uid"] for seen in result["a"]} == {a_uid}
    assert {seen["environ"] for seen in result["a"]} == {"PermissionError"}, result
    assert (result["listdir"], result["read"]) == ("PermissionError", "PermissionError"), result
    a_done = until(cluster, "iso-a", ended, 120)
    assert a_done["state"] == "SUCCEEDED", json.dumps(a_done["timeline"][-6:])


@pytest.mark.timeout(600)
def test_a_failed_shards_message_never_carries_its_jobs_token(cluster: Path) -> None:
    submit(cluster, entry_job("iso-c", "V100", [str(cluster / "scripts" / "c.py")], {"HF_TOKEN": SECRET}))
    until(cluster, "iso-c", ended, 240)
    monitor = ClusterInfo.load(cluster).live().monitor_url

    view = get_json(f"{monitor}/api/jobs/iso-c")

    assert view["state"] == "FAILED", json.dumps(view["timeline"][-6:])
    assert "connecting with token ***" in view["message"], view["message"]
    served = json.dumps(view) + json.dumps(get_json(f"{monitor}/api/jobs"))
    assert SECRET not in served
    (log,) = (shard_log_dir(cluster, "iso-c") / "iso-c").glob("shard-0-attempt-*.log")
    assert SECRET in log.read_text()  # the script did print it: the agent kept it off the bus
    assert owner_and_mode(log) == (os.geteuid(), 0o600)
