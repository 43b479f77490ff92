"""A disk that fills under a running job, end to end: two agents whose job outputs and checkpoints
(``/data/checkpoints``) map to a small tmpfs each (64 MiB), the model and dataset on a shared folder, every service on
a real broker, and a placement floor of 16 MiB (``--disk-floor-bytes``, the monitor's ``--alert-disk-floor-bytes``).

1. A job runs on node-a (node-b is drained until it trains). The test fills node-a's tmpfs with one big file. The
   shard's next checkpoint fails: it ends DISK_FULL, naming the file it could not write and the space left there;
   node-a is reported with under the floor free and the DISK_FULL alert fires for it. The job moves to node-b at once,
   outside its retry budget (the checkpoint it leaves is on node-a's own disk: it starts over there), and succeeds:
   one failure, no retry spent.
2. Then node-b's tmpfs is filled too. A second job waits with the DISK_FULL reason naming both nodes, and starts
   nowhere, until node-b's big file is deleted: it then runs there and succeeds.

Mounting needs root (``mount -t tmpfs``); the test skips, saying so, where it is not permitted.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from shardyard.bus.replay import replay
from shardyard.bus.topics import ALERTS, LIFECYCLE, SHARD_EVENTS
from shardyard.cli import client
from shardyard.cli.cluster import ClusterInfo, down, up
from shardyard.events import AlertFiring, AlertRule, FailureCause, JobRecovering, JobScheduled, ShardFailed
from shardyard.training.artifacts import create_demo_artifacts
from tests.support import wait
from tests.support.cluster import reachable_by_shards
from tests.support.processes import service

pytestmark = [pytest.mark.slow, pytest.mark.broker]

MIB = 1 << 20
DISK_SIZE = "64m"
FLOOR = 16 * MIB
NODES = ("node-a", "node-b")
PORT_BASE = 31600
"""Node i hosts rendezvous on 16 ports from PORT_BASE + 16 i: off the ranges of ``shardyard up`` (29500 + 50 i)."""
FLOORS = {"SHARDYARD_DISK_FLOOR_BYTES": str(FLOOR), "SHARDYARD_ALERT_DISK_FLOOR_BYTES": str(FLOOR)}
"""The scheduler's and fault manager's floor, and the monitor's (1 GiB by default: more than the whole tmpfs)."""


def mount_tmpfs(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE},mode=0755", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (mount exit {done.returncode}): {done.stderr.strip() or done.stdout}")


def unmount(directory: Path) -> None:
    if subprocess.run(["umount", str(directory)], capture_output=True, check=False).returncode != 0:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)  # a straggler holds it


def fill(directory: Path) -> Path:
    """Write one big file until the disk is full (ENOSPC); its path."""
    big = directory / "filler.bin"
    chunk = b"\0" * MIB
    with open(big, "wb", buffering=0) as out:
        try:
            while True:
                out.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return big


def agent_argv(index: int, run_dir: Path, data: Path) -> list[str]:
    node = NODES[index]
    return [
        *("--node-id", node, "--gpus", "A100:1", "--cpu-cores", "16", "--memory-gib", "64"),
        *("--mounts", f"/data={data}", "--mounts", f"/data/checkpoints={run_dir / f'disk-{node}'}"),
        # The model and dataset are on a folder every node shares; the checkpoints are each node's own.
        *("--shared-mounts", "/data/models", "--shared-mounts", "/data/datasets"),
        *("--rendezvous-port-base", str(PORT_BASE + 16 * index), "--rendezvous-port-count", "16"),
        *("--log-dir", str(run_dir / "logs" / "shards"), "--standbys", "none"),
    ]


@pytest.fixture(scope="module")
def cluster(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ClusterInfo, Path]]:
    run_dir = reachable_by_shards(tmp_path_factory.mktemp("storage"))
    data = run_dir / "data"
    create_demo_artifacts(data)
    with ExitStack() as stack:
        for node in NODES:
            disk = run_dir / f"disk-{node}"
            mount_tmpfs(disk)
            stack.callback(unmount, disk)
        os.environ.update(FLOORS)
        try:
            info = up(run_dir / "run", nodes=(), replicas=1, data_root=data, bootstrap=bootstrap, timeout_s=120)
        finally:
            for name in FLOORS:
                del os.environ[name]
        stack.callback(down, Path(info.run_dir), say=lambda _line: None)
        for index in range(len(NODES)):
            args = agent_argv(index, run_dir, data)
            stack.enter_context(service("shardyard.node_agent", args, bootstrap=bootstrap, log_dir=run_dir / "agents"))
        yield info, run_dir


def events_of(info: ClusterInfo, topic: Any, kind: type, job_id: str | None = None) -> list[Any]:
    found: list[Any] = []

    def keep(_topic: object, event: object) -> None:
        if isinstance(event, kind) and (job_id is None or getattr(event, "job_id", None) == job_id):
            found.append(event)

    asyncio.run(replay(info.bootstrap, [topic], keep))
    return found


def node_view(info: ClusterInfo, node_id: str) -> dict[str, Any]:
    return client.node(info.monitor_url, node_id) or {}


def free_bytes(info: ClusterInfo, node_id: str) -> int | None:
    disk = node_view(info, node_id).get("output_disk")
    return None if disk is None else int(disk["free_bytes"])


def below_floor(info: ClusterInfo, node_id: str) -> tuple[int] | None:
    """The free bytes the monitor shows for the node's output disk, once they are below the floor."""
    free = free_bytes(info, node_id)
    return (free,) if free is not None and free < FLOOR else None


def job(job_id: str) -> bytes:
    return json.dumps(
        {
            "task_id": job_id,
            "task_type": "micro_train",
            "resource_requirements": {"gpu": {"count": 1, "model": "A100", "min_flops": 35}, "memory": "2GiB"},
            "priority": 5,
            "dependencies": {"pretrained_model": "/data/models/gpt2_pretrained", "dataset": "/data/datasets/wikitext"},
            "shard_count": 1,
            "sync_interval": 10,  # a checkpoint every 10 steps (the agents' --checkpoint-every 1)
            "training": {"max_steps": 600, "batch_size": 8, "seed": 1},
        }
    ).encode()


def state_of(info: ClusterInfo, job_id: str) -> dict[str, Any]:
    return client.job(info.monitor_url, job_id) or {}


def drain(info: ClusterInfo, node_id: str, draining: bool) -> None:
    client.request_drain(info.bootstrap, node_id, draining=draining)
    wait.until(lambda: node_view(info, node_id).get("draining") is draining, f"{node_id} draining={draining}", 30)


@pytest.mark.timeout(600)
def test_a_full_disk_moves_the_job_to_a_disk_with_room_and_without_room_the_job_waits_for_one(
    cluster: tuple[ClusterInfo, Path],
) -> None:
    info, run_dir = cluster
    for node in NODES:
        wait.until(lambda n=node: (free_bytes(info, n) or 0) > FLOOR, f"{node} reporting its output disk", 90)

    # 1. A job on node-a; node-a's disk fills while it trains.
    drain(info, "node-b", True)
    client.submit(info.bootstrap, job("disk-1"))
    wait.until(
        lambda: (s := state_of(info, "disk-1")).get("state") == "RUNNING" and (s.get("step") or 0) >= 1,
        "disk-1 training on node-a",
        120,
        every_s=0.2,
        describe=lambda: state_of(info, "disk-1"),
    )
    drain(info, "node-b", False)
    fill(run_dir / "disk-node-a")
    filled_at = time.monotonic()

    failure: ShardFailed = wait.until(
        lambda: next(iter(events_of(info, SHARD_EVENTS, ShardFailed, "disk-1")), None),
        "disk-1's shard failing on node-a",
        60,
        every_s=0.5,
    )
    print(f"\nshard failed after {time.monotonic() - filled_at:.1f} s: {failure.cause}: {failure.message}")
    assert (failure.node_id, failure.cause, failure.exit_code) == ("node-a", FailureCause.DISK_FULL, 10), failure
    assert str(run_dir / "disk-node-a" / "disk-1") in failure.message, failure.message  # the file it failed on
    assert " free of 64MiB" in failure.message, failure.message  # and the space left

    (low,) = wait.until(lambda: below_floor(info, "node-a"), "node-a reported with its disk below the floor", 30)
    print(f"node-a's output disk: {low} bytes free (floor {FLOOR})")
    alert = wait.until(
        lambda: next((a for a in events_of(info, ALERTS, AlertFiring) if a.rule is AlertRule.DISK_FULL), None),
        "DISK_FULL firing for node-a",
        30,
        every_s=0.5,
    )
    print(f"alert {alert.rule} {alert.subject}: {alert.summary}")
    assert alert.subject == "node-a"

    done = wait.until(
        lambda: (s := state_of(info, "disk-1")).get("state") in ("SUCCEEDED", "FAILED") and s,
        "disk-1 ending",
        240,
        every_s=1.0,
        describe=lambda: state_of(info, "disk-1"),
    )
    (recovery,) = events_of(info, LIFECYCLE, JobRecovering, "disk-1")
    placed = events_of(info, LIFECYCLE, JobScheduled, "disk-1")
    print(f"recovery: {recovery.message}")
    print(f"disk-1 {done['state']} on {[p.node_id for p in placed[-1].placements]} after {len(placed)} placements")
    assert done["state"] == "SUCCEEDED", done
    assert (recovery.counted, recovery.retries_used, recovery.avoid_nodes) == (False, 0, ("node-a",)), recovery
    assert [[p.node_id for p in s.placements] for s in placed] == [["node-a"], ["node-b"]]
    assert len(events_of(info, SHARD_EVENTS, ShardFailed, "disk-1")) == 1  # one failure: no retry burnt

    # 2. Both disks full: a new job waits, naming them, until one has room.
    filler_b = fill(run_dir / "disk-node-b")
    wait.until(lambda: below_floor(info, "node-b"), "node-b reported with its disk below the floor", 30)
    client.submit(info.bootstrap, job("disk-2"))
    waiting = wait.until(
        lambda: (s := state_of(info, "disk-2")).get("reason") == "DISK_FULL" and s,
        "disk-2 waiting with DISK_FULL",
        60,
        every_s=0.5,
        describe=lambda: state_of(info, "disk-2"),
    )
    print(f"disk-2 waits: {waiting['reason']}: {waiting['message']}")
    assert "node-a (" in waiting["message"] and "node-b (" in waiting["message"], waiting
    assert events_of(info, LIFECYCLE, JobScheduled, "disk-2") == []

    filler_b.unlink()
    ended = wait.until(
        lambda: (s := state_of(info, "disk-2")).get("state") in ("SUCCEEDED", "FAILED") and s,
        "disk-2 ending once node-b has room",
        240,
        every_s=1.0,
        describe=lambda: state_of(info, "disk-2"),
    )
    (only,) = events_of(info, LIFECYCLE, JobScheduled, "disk-2")
    print(f"disk-2 {ended['state']} on {[p.node_id for p in only.placements]}")
    assert ended["state"] == "SUCCEEDED" and [p.node_id for p in only.placements] == ["node-b"], ended
    assert events_of(info, SHARD_EVENTS, ShardFailed, "disk-2") == []
