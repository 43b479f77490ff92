"""An exclusion ends once its node is healthy again, against a real cluster: a one-node cluster (so the node is the
job's only fitting one) whose agent is frozen long enough to be suspected (a loaded or hung host, for seconds). The
job's attempt fails there and its recovery excludes the node; the node comes back ALIVE. The job's reason then names
the node and when its exclusion ends, and once the node has been ALIVE for the heal time (8 s here,
``SHARDYARD_EXCLUSION_HEAL_S``) the job runs there again and succeeds. Before, it waited NO_FIT for ever."""

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardyard.cli.client import node
from shardyard.cli.cluster import ClusterInfo
from tests.e2e.test_placement_e2e import document, submit, until
from tests.support import wait
from tests.support.cluster import local_cluster

pytestmark = [pytest.mark.slow, pytest.mark.broker]

HEAL_S = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    env = {"SHARDYARD_EXCLUSION_HEAL_S": str(HEAL_S)}
    with local_cluster(tmp_path_factory.mktemp("heal"), ("A100:1",), replicas=1, env=env) as run_dir:
        yield run_dir


@pytest.mark.timeout(400)
def test_a_job_whose_only_node_was_excluded_runs_there_again_once_it_is_healthy(cluster: Path) -> None:
    job = document("healing", sync_interval=10, shard_count=1, training={"max_steps": 400, "batch_size": 2})
    job["resource_requirements"]["gpu"]["count"] = 1
    submit(cluster, job)
    until(cluster, "healing", lambda j: j["state"] == "RUNNING" and (j.get("step") or 0) >= 20, 180)

    info = ClusterInfo.load(cluster)
    pid = info.pids["node-0"]
    os.kill(pid, signal.SIGSTOP)  # a host stalled for seconds: suspected, not dead
    try:
        wait.until(
            lambda: (node(info.live().monitor_url, "node-0") or {}).get("status") in ("SUSPECT", "LOST"),
            "node-0 suspected",
            30,
            every_s=0.2,
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    back = time.monotonic()

    waiting = until(cluster, "healing", lambda j: "excluded after a failure: node-0" in (j.get("message") or ""), 60)
    assert waiting["state"] == "READY", waiting
    done = until(cluster, "healing", lambda j: j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"), 300)
    assert done["state"] == "SUCCEEDED", done["timeline"][-10:]
    rescheduled = [e for e in done["timeline"] if e["event"] == "scheduled"]
    assert len(rescheduled) == 2 and time.monotonic() - back >= HEAL_S, done["timeline"]
