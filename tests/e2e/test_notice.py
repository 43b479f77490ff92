"""Checkpoint on notice end to end (issue 34): a real local cluster of two A100:1 nodes on a real broker. A
low-priority job runs; a higher-priority job needs both GPUs and preempts it. The preempted gang gets the notice,
checkpoints at once and acknowledges (exit 75), so it is stopped long before the notice's deadline (30 s, the
scheduler's default) and its next attempt resumes from the step it had reached when noticed:

- a job's own script (``examples/checkpoint_on_notice.py``) that knows only the documented signal and variables
  (``SHARDYARD_NOTICE_SIGNAL``, ``SHARDYARD_CHECKPOINT_DIR``, ``SHARDYARD_RESUME_DIR``) and no ``shardyard`` code;
- the built-in runner with local SGD whose next parameter sync is far away (``sync_interval`` past ``max_steps``):
  it stops between syncs, not at the next one.

The figures (notice -> gang stopped, steps) are printed: ``pytest -s``.
"""

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardyard.training.artifacts import create_demo_artifacts
from tests.e2e.test_placement_e2e import document, first_at, submit, until, view
from tests.support import wait
from tests.support.cluster import ONE_REPLICA, ROOT, cli

pytestmark = [pytest.mark.slow, pytest.mark.broker]

NOTICE_S = 30.0
"""The scheduler's default ``preempt_deadline_s``: the cluster runs with it."""
ACKNOWLEDGED_WITHIN_S = NOTICE_S / 3
""""Well before the deadline": the gang must have stopped (every shard acknowledged) within a third of it."""
LOGGED_STEP = re.compile(r"^(?:\[shard \d+ attempt \d+\] )?step (\d+)$", re.MULTILINE)
NOTICE_AFTER = re.compile(r"rank (\d+)/\d+\]: notice after step (\d+)")
RESUMING_AT = re.compile(r"rank (\d+)\]: resuming from \S+ at step (\d+)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    run_dir = tmp_path_factory.mktemp("notice")
    create_demo_artifacts(run_dir / "data")
    (run_dir / "data" / "code").symlink_to(ROOT, target_is_directory=True)
    started = cli("up", *ONE_REPLICA, "--node", "A100:1", "--node", "A100:1", run_dir=run_dir, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield run_dir
    finally:
        cli("down", run_dir=run_dir, timeout=120)


def ended(job: dict[str, Any]) -> bool:
    return job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")


def vip(task_id: str) -> dict[str, Any]:
    """A short job of priority 9 that needs both A100s: only a preemption makes room for it."""
    return document(task_id, priority=9, entrypoint={"command": [sys.executable, "-c", "pass"]})


def logs(run_dir: Path, job_id: str, attempt: int, *, written: bool = True) -> str:
    """The job's shard logs of ``attempt`` (``written`` False: "" while it has none yet)."""
    shown = cli("logs", job_id, "--attempt", str(attempt), run_dir=run_dir)
    assert shown.returncode == 0 or not written, shown.stderr
    return shown.stdout if shown.returncode == 0 else ""


def preempted_once(run_dir: Path, low: str, by: str) -> dict[str, Any]:
    """Preempt the running ``low`` with the job ``by``; both end SUCCEEDED. ``low``'s view, its figures printed."""
    submit(run_dir, vip(by))
    done = until(run_dir, by, ended, 180)
    assert done["state"] == "SUCCEEDED", done.get("message")
    job = until(run_dir, low, ended, 300)
    assert job["state"] == "SUCCEEDED", json.dumps(job["timeline"][-8:])
    events = [e["event"] for e in job["timeline"]]
    assert events.count("preempting") == 1 and events.count("preempted") == 1, events
    assert first_at(job, "preempted") < first_at(done, "scheduled")
    return job


def stopped_after_s(job: dict[str, Any]) -> float:
    return first_at(job, "preempted") - first_at(job, "preempting")


def ledger_shows_the_notice(job: dict[str, Any]) -> str:
    """The job's goodput ledger (its detail's ``goodput``): the notice as long as the timeline's preempting ->
    preempted, within 2 %; no recomputed work; the parts add up to its life, accepted -> succeeded."""
    ledger = job["goodput"]
    notice, life = stopped_after_s(job), first_at(job, "succeeded") - first_at(job, "accepted")
    assert ledger["recomputed_s"] == 0, ledger
    assert abs(ledger["notice_s"] - notice) <= 0.02 * notice, (ledger, notice)
    assert abs(ledger["total_s"] - life) <= 0.02 * life, (ledger, life)
    return (
        f"ledger: notice {ledger['notice_s']:.3f} s (timeline {notice:.3f} s), recomputed {ledger['recomputed_s']} s, "
        f"queued {ledger['queued_s']:.2f} s, recovery {ledger['recovery_s']:.2f} s, "
        f"productive {ledger['productive_s']:.2f} s, ETTR {ledger['ettr']:.3f}"
    )


def test_a_users_script_checkpoints_on_the_documented_signal_and_resumes_where_it_was_noticed(cluster: Path) -> None:
    command = [sys.executable, "examples/checkpoint_on_notice.py", "--steps", "800", "--work", "60000"]
    low = document(
        "notice-script",
        priority=1,
        shard_count=1,
        resource_requirements={"gpu": {"count": 1, "model": "A100"}, "memory": "4GiB", "cpu_cores": 1},
        entrypoint={"command": command, "working_dir": "/data/code"},
    )
    submit(cluster, low)
    wait.until(
        lambda: [
            int(s) for s in LOGGED_STEP.findall(logs(cluster, "notice-script", 1, written=False)) if int(s) >= 100
        ],
        "the script past step 100",
        120,
        every_s=0.5,
        describe=lambda: (view(cluster, "notice-script"), logs(cluster, "notice-script", 1, written=False)[-2000:]),
    )

    job = preempted_once(cluster, "notice-script", "vip-over-script")

    notices = cluster / "data" / "checkpoints" / "notice-script" / "notices.jsonl"
    lines = [json.loads(line) for line in notices.read_text().splitlines()]
    (noticed,) = [line for line in lines if line["event"] == "noticed"]
    resumed = [line for line in lines if line["event"] == "resumed" and line["attempt"] == 2]
    assert noticed["attempt"] == 1 and noticed["after_step"] >= 100, lines
    assert (resumed[0]["notice_signal"], resumed[0]["notice_s"]) == ("SIGUSR1", str(NOTICE_S)), resumed
    lost = max(0, noticed["after_step"] - resumed[0]["step"])
    took = stopped_after_s(job)
    print(
        f"\nown script: noticed after step {noticed['after_step']}, saved step {noticed['saved_step']} "
        f"{noticed['took_s'] * 1000:.1f} ms after the signal; attempt 2 resumed at step {resumed[0]['step']} "
        f"({lost} complete steps lost); notice -> gang stopped (JobPreempting -> JobPreempted) {took:.2f} s"
    )
    assert resumed[0]["step"] == noticed["saved_step"] >= noticed["after_step"]  # only the step in flight is lost
    assert took < ACKNOWLEDGED_WITHIN_S
    print(ledger_shows_the_notice(job))
    assert "no checkpoint" not in json.dumps(job["timeline"])


def test_the_built_in_runner_stops_between_far_apart_syncs_and_resumes_where_it_was_noticed(cluster: Path) -> None:
    """``sync_interval`` 5000 past ``max_steps`` 400: the only sync is the last step's, so before this change the
    gang trained on to its deadline and was revoked, losing everything since its start."""
    low = document("notice-runner", priority=1, sync_interval=5000, training={"max_steps": 400, "batch_size": 4})
    submit(cluster, low)
    until(cluster, "notice-runner", lambda j: j["state"] == "RUNNING" and (j.get("step") or 0) >= 40, 120)

    job = preempted_once(cluster, "notice-runner", "vip-over-runner")

    noticed = {int(rank): int(step) for rank, step in NOTICE_AFTER.findall(logs(cluster, "notice-runner", 1))}
    resumed = {int(rank): int(step) for rank, step in RESUMING_AT.findall(logs(cluster, "notice-runner", 2))}
    assert sorted(noticed) == [0, 1] and sorted(resumed) == [0, 1], (noticed, resumed)
    (resumed_at,) = set(resumed.values())
    took = stopped_after_s(job)
    print(
        f"\nbuilt-in runner: noticed after steps {noticed} (rank: step), resumed at step {resumed_at} "
        f"({max(0, max(noticed.values()) - resumed_at)} complete steps lost); notice -> gang stopped {took:.2f} s"
    )
    assert resumed_at >= max(noticed.values())  # every step complete at the notice was kept
    assert resumed_at < 400
    assert took < ACKNOWLEDGED_WITHIN_S
    print(ledger_shows_the_notice(job))
    assert job["step"] == 400
