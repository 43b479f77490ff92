"""The autoscaler end to end (issue 35): ``shardyard up --autoscale`` on a real broker with real agents and shards.

A cluster of one A100 node gets a job that needs two V100s: it waits NEVER_FITS, the scheduler asks for capacity,
the autoscaler adds one V100:2 agent (``auto-v100-0``), the job runs there and succeeds; the node, idle past its
short lifetime, is drained and removed (its process stops, it leaves the cluster file), and nothing is added again.
A second such job brings a node of that name back (not drained), and ``shardyard down`` stops it with the rest.
"""

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shardyard.cli.children import alive
from shardyard.cli.cluster_info import ClusterInfo, get_json
from tests.e2e.test_placement_e2e import document, first_at, submit, until
from tests.support import wait
from tests.support.cluster import local_cluster

pytestmark = [pytest.mark.slow, pytest.mark.broker]

NODE = "auto-v100-0"
PROCESS = f"node-{NODE}"
SHORT = "3"
"""Seconds: the cooldown, an added node's lifetime and the idle time before the scheduler offers it for reclaim."""
OPTIONS = (
    "--autoscale",
    "--autoscale-gpus",
    "V100:2",
    "--autoscale-max-nodes",
    "2",
    "--autoscale-cooldown-s",
    SHORT,
    "--autoscale-min-lifetime-s",
    SHORT,
    "--autoscale-idle-s",
    SHORT,
)


def v100_job(task_id: str, steps: int) -> dict[str, Any]:
    job = document(task_id, training={"max_steps": steps}, sync_interval=10)
    job["resource_requirements"] = {
        **job["resource_requirements"],
        "gpu": {"count": 2, "model": "V100", "min_flops": 15},
    }
    return job


def node(run_dir: Path) -> dict[str, Any] | None:
    info = ClusterInfo.load(run_dir).live()
    found = [n for n in get_json(f"{info.monitor_url}/api/nodes")["nodes"] if n["node_id"] == NODE]
    return found[0] if found else None


def actions(run_dir: Path) -> dict[tuple[str, str], float]:
    """``shardyard_autoscaler_actions_total`` from the autoscaler's own metrics port, by (action, outcome)."""
    port = ClusterInfo.load(run_dir).metrics_ports["autoscaler-0"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (s.labels["action"], s.labels["outcome"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "shardyard_autoscaler_actions_total"
    }


def agent_pid(run_dir: Path) -> int | None:
    return ClusterInfo.load(run_dir).pids.get(PROCESS)


def test_the_autoscaler_adds_a_node_for_a_waiting_job_and_removes_it_once_idle(tmp_path: Path) -> None:
    with local_cluster(tmp_path / "run", ["A100:1"], replicas=1, options=OPTIONS) as run_dir:
        submit(run_dir, v100_job("needs-v100", 30))
        up = wait.until(lambda: (n := node(run_dir)) and n["status"] == "ALIVE" and n, f"{NODE} ALIVE", 90, every_s=0.2)
        alive_at = time.time()
        assert [g["model"] for g in up["gpus"]] == ["V100", "V100"]
        pid = agent_pid(run_dir)
        assert pid is not None and alive(pid), "the added agent is recorded where `down` finds it"

        done = until(run_dir, "needs-v100", lambda j: j["state"] in ("SUCCEEDED", "FAILED"), 180)
        assert done["state"] == "SUCCEEDED", done.get("message")
        assert {(p["node_id"], p["gpu_model"]) for p in done["placements"]} == {(NODE, "V100")}
        waited = first_at(done, "unschedulable")

        wait.until(lambda: not alive(pid) and agent_pid(run_dir) is None, f"{NODE} removed once idle", 90, every_s=0.2)
        removed_at = time.time()
        print(
            f"capacity asked -> {NODE} ALIVE: {alive_at - waited:.1f}s (seen by polling); -> job scheduled: "
            f"{first_at(done, 'scheduled') - waited:.1f}s; job ended -> node removed: "
            f"{removed_at - first_at(done, 'succeeded'):.1f}s"
        )
        counted = actions(run_dir)
        assert counted.get(("add", "ok")) == 1 and counted.get(("remove", "ok")) == 1, counted
        assert not any(outcome == "failed" for _action, outcome in counted), counted

        # No flapping: with nothing waiting, nothing is added again, watched over four cooldowns.
        def steady() -> bool:
            assert actions(run_dir).get(("add", "ok")) == 1 and agent_pid(run_dir) is None, "added again"
            return time.time() - removed_at >= 4 * float(SHORT)

        wait.until(steady, "four cooldowns without an addition", 30, every_s=0.5)

        # A node of the same name comes back for the next job, undrained; `down` stops it.
        submit(run_dir, v100_job("needs-v100-again", 3000))
        until(run_dir, "needs-v100-again", lambda j: j["state"] == "RUNNING", 120)
        again = node(run_dir)
        assert again is not None and not again.get("draining"), json.dumps(again)[:500]
        second = agent_pid(run_dir)
        assert second is not None and second != pid
    assert not alive(second), "`down` stopped the added agent"
