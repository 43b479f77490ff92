"""Elastic jobs on a real cluster of two A100:2 nodes (issue 35), with the scheduler's resize cooldown at 5 s:

- a job preferring more shards than the free GPUs starts at what fits and succeeds at that size;
- a running elastic gang grows into GPUs another job gave back, and shrinks to its minimum when a higher-priority
  job needs GPUs, instead of being stopped whole; each time its gang re-forms from its members' live state (no step
  lost, no retry used), and its core up to ``min_shards`` is protected from a job that would need it.

The figures (GPUs free -> training at 4; the arrival -> the GPUs it needed placed) are printed: ``pytest -s``."""

import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_placement_e2e import document, first_at, submit, until
from tests.support.cluster import cli, local_cluster

pytestmark = [pytest.mark.slow, pytest.mark.broker]

KEPT = re.compile(r"kept the gang's state of step (\d+)")
RESUMED = re.compile(r"resuming from its peers' state of step (\d+)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    env = {"SHARDYARD_RESIZE_COOLDOWN_S": "5"}
    with local_cluster(tmp_path_factory.mktemp("elastic"), ("A100:2", "A100:2"), replicas=1, env=env) as run_dir:
        yield run_dir


def ended(job: dict[str, Any]) -> bool:
    return job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")


def gpus(count: int) -> dict[str, Any]:
    return {"gpu": {"count": count, "model": "A100"}, "memory": f"{count}GiB", "cpu_cores": count}


def elastic(task_id: str, *, preferred: int, low: int, high: int, steps: int, **fields: Any) -> dict[str, Any]:
    return document(
        task_id,
        shard_count=preferred,
        elasticity={"min_shards": low, "max_shards": high},
        resource_requirements=gpus(preferred),
        training={"max_steps": steps, "batch_size": 2},
        **fields,
    )


def script(task_id: str, count: int, priority: int, seconds: float) -> dict[str, Any]:
    """A job's own script that holds ``count`` GPUs for ``seconds``."""
    command = [sys.executable, "-c", f"import time; time.sleep({seconds})"]
    return document(
        task_id,
        priority=priority,
        shard_count=count,
        resource_requirements=gpus(count),
        entrypoint={"command": command},
    )


def training(attempt: int, size: int) -> Callable[[dict[str, Any]], bool]:
    """Whether every shard of ``attempt`` (of ``size``) has reported a step."""

    def check(job: dict[str, Any]) -> bool:
        ours = [s for s in job["shards"].values() if s.get("attempt") == attempt and s.get("step", 0) > 0]
        return job["state"] == "RUNNING" and len(ours) == size

    return check


def resizes(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in job["timeline"] if e["event"].startswith("resized")]


def logs(run_dir: Path, job_id: str, attempt: int) -> str:
    shown = cli("logs", job_id, "--attempt", str(attempt), run_dir=run_dir)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def steps_lost(run_dir: Path, job_id: str, attempt: int) -> int:
    """Steps the re-formation into ``attempt`` lost: the last step the ranks of the attempt before completed (the
    state each kept when it was stopped) less the step the new gang resumed from (the same on every rank)."""
    kept = [int(s) for s in KEPT.findall(logs(run_dir, job_id, attempt - 1))]
    resumed = {int(s) for s in RESUMED.findall(logs(run_dir, job_id, attempt))}
    assert kept and len(resumed) == 1, (kept, resumed)
    return max(kept) - resumed.pop()


@pytest.mark.timeout(300)
def test_an_elastic_job_too_large_for_the_free_gpus_starts_at_what_fits_and_succeeds(cluster: Path) -> None:
    job = elastic("elastic-small", preferred=6, low=1, high=6, steps=40, sync_interval=10)
    submit(cluster, job)

    done = until(cluster, "elastic-small", ended, 240)

    assert done["state"] == "SUCCEEDED", done["timeline"][-10:]
    assert len(done["placements"]) == 4, done["placements"]
    assert sorted(done["shards"]) == ["0", "1", "2", "3"], done["shards"]


@pytest.mark.timeout(600)
def test_a_running_gang_grows_into_freed_gpus_and_shrinks_for_a_higher_priority_job_without_losing_a_step(
    cluster: Path,
) -> None:
    submit(cluster, script("filler", 2, priority=0, seconds=600))
    until(cluster, "filler", lambda j: j["state"] == "RUNNING", 120)
    submit(
        cluster,
        elastic("grower", preferred=4, low=2, high=4, steps=100_000, priority=1, preemptible=False, sync_interval=1),
    )
    started = until(cluster, "grower", lambda j: j["state"] == "RUNNING" and j["step"] >= 20, 180)
    assert len(started["placements"]) == 2, started["placements"]

    # Grow: the filler gives its GPUs back; the gang takes them once its attempt is past the cooldown.
    assert cli("cancel", "filler", "--wait", run_dir=cluster).returncode == 0
    freed_at = first_at(until(cluster, "filler", ended, 60), "cancelled")
    grown = until(cluster, "grower", training(2, 4), 120)
    (grow,) = resizes(grown)
    assert grow["event"] == "resized 2 -> 4" and "GROW_INTO_IDLE" in grow["detail"], grow
    assert len(grown["placements"]) == 4
    print(
        f"\ngrow: GPUs free -> resized {first_at(grown, 'resized 2 -> 4') - freed_at:.2f} s, "
        f"-> every shard at 4 training {time.time() - freed_at:.2f} s (polled)"
    )
    assert steps_lost(cluster, "grower", 2) == 0

    # Shrink: a job of higher priority needs 2 GPUs; the gang gives up its 2 surplus shards and keeps training.
    submit(cluster, script("vip", 2, priority=9, seconds=600))
    vip = until(cluster, "vip", lambda j: j["state"] == "RUNNING", 120)
    shrunk = until(cluster, "grower", training(3, 2), 120)
    shrink = resizes(shrunk)[1]
    assert shrink["event"] == "resized 4 -> 2" and "SHRINK_FOR_PREEMPTION for vip" in shrink["detail"], shrink
    assert not [e for e in shrunk["timeline"] if e["event"] in ("preempting", "preempted", "recovering")]
    print(f"shrink: vip submitted -> placed {first_at(vip, 'scheduled') - first_at(vip, 'accepted'):.2f} s")
    assert steps_lost(cluster, "grower", 3) == 0

    # Its core is protected: while the vip runs, a job that would need one of its 2 shards waits; the gang stays.
    submit(cluster, script("greedy", 3, priority=9, seconds=1))
    waiting = until(cluster, "greedy", lambda j: j["state"] == "READY" and j["reason"], 60)
    assert waiting["reason"] != "PREEMPTING", waiting
    held = until(cluster, "grower", lambda j: j["state"] == "RUNNING", 30)
    assert held["attempt"] == 3 and len(held["placements"]) == 2, held["timeline"][-6:]
    for done in ("greedy", "vip"):
        assert cli("cancel", done, "--wait", run_dir=cluster).returncode == 0

    assert cli("cancel", "grower", "--wait", run_dir=cluster).returncode == 0
    ledger = until(cluster, "grower", ended, 60)["goodput"]
    assert ledger["recomputed_s"] == 0, ledger
