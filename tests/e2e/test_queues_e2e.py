"""Two teams share a real cluster through their queues: team A fills it by borrowing team B's idle quota, team B
submits, and A's borrowed gang is checkpointed and requeued (reclaim). B's job starts within the preemption
deadline; A's job waits on quota (QUOTA_EXCEEDED) while B runs, then resumes from its checkpoint and succeeds.
``shardyard queues`` shows the numbers at each step."""

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardyard.training.artifacts import create_demo_artifacts
from tests.e2e.test_placement_e2e import document, first_at, submit, until
from tests.support import wait
from tests.support.cluster import ONE_REPLICA, cli

pytestmark = [pytest.mark.slow, pytest.mark.broker]

QUEUES = """
min_runtime_s: 2
starving_after_s: 600
queues:
  team-a: {cohort: lab, gpus: {A100: 1}}
  team-b: {cohort: lab, gpus: {A100: 1}}
"""
PREEMPT_DEADLINE_S = 30.0
"""The scheduler's default preemption deadline: a reclaimed gang checkpoints and stops within it."""
A_STEPS = 1200


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    run_dir = tmp_path_factory.mktemp("teams")
    create_demo_artifacts(run_dir / "data")
    queues = run_dir / "queues.yaml"
    queues.write_text(QUEUES)
    started = cli(
        "up", *ONE_REPLICA, "--node", "A100:1", "--node", "A100:1", "--queues-file", str(queues), run_dir=run_dir,
        timeout=180,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield run_dir
    finally:
        cli("down", run_dir=run_dir, timeout=120)


def queues(run_dir: Path) -> dict[str, Any]:
    """``shardyard queues -o json``: queue -> its row."""
    shown = cli("queues", "-o", "json", run_dir=run_dir)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    return {row["queue"]: row for row in json.loads(shown.stdout)["queues"]}


def a100(run_dir: Path, queue: str) -> dict[str, Any]:
    return dict(queues(run_dir)[queue]["models"].get("A100", {}))


def until_queues(run_dir: Path, what: str, check: Callable[[dict[str, Any]], bool], timeout_s: float) -> None:
    last: dict[str, Any] = {}

    def probe() -> bool:
        nonlocal last
        last = queues(run_dir)
        return check(last)

    wait.until(probe, what, timeout_s, every_s=0.5, describe=lambda: json.dumps(last)[:2000])


def test_a_borrowed_gang_is_reclaimed_for_its_lender_and_resumes_after(shared: Path) -> None:
    until_queues(shared, "both queues configured", lambda q: {"team-a", "team-b"} <= q.keys(), 60)

    # Team A takes both A100s: its own one, and team B's idle one, borrowed.
    borrower = document("a-big", queue="team-a", sync_interval=20, training={"max_steps": A_STEPS, "batch_size": 4})
    submit(shared, borrower)
    until(shared, "a-big", lambda j: j["state"] == "RUNNING" and (j.get("step") or 0) >= 40, 180)
    until_queues(shared, "team-a borrowing one A100", lambda q: q["team-a"]["models"]["A100"]["borrowed"] == 1, 30)
    row = a100(shared, "team-a")
    assert (row["nominal"], row["used"], row["borrowed"]) == (1, 2, 1), row
    assert a100(shared, "team-b")["lent"] == 1

    # Team B wants its A100 back.
    lender = document(
        "b-small",
        queue="team-b",
        resource_requirements={
            "gpu": {"count": 1, "model": "A100", "min_flops": 35},
            "memory": "32GiB",
            "cpu_cores": 4,
        },
        shard_count=1,
        sync_interval=20,
        training={"max_steps": 60, "batch_size": 4},
    )
    submitted = time.time()
    submit(shared, lender)
    started = ("SCHEDULED", "RUNNING", "SUCCEEDED")
    b = until(shared, "b-small", lambda j: j["state"] in started, PREEMPT_DEADLINE_S + 30)
    assert first_at(b, "scheduled") - submitted <= PREEMPT_DEADLINE_S + 10, b["timeline"]

    # While B runs, A waits on quota: it holds nothing, and may not borrow what B uses.
    waiting = until(shared, "a-big", lambda j: j["state"] != "RUNNING" and j.get("reason") == "QUOTA_EXCEEDED", 60)
    assert "team-a" in waiting["message"] and "A100" in waiting["message"], waiting["message"]
    status = cli("status", "a-big", run_dir=shared)
    assert "team-a" in status.stdout and "QUOTA_EXCEEDED" in status.stdout, status.stdout
    row = a100(shared, "team-b")
    assert row["used"] == 1 and row["borrowed"] == 0, row

    b_done = until(shared, "b-small", lambda j: j["state"] in ("SUCCEEDED", "FAILED"), 180)
    assert b_done["state"] == "SUCCEEDED", b_done.get("message")

    a_done = until(shared, "a-big", lambda j: j["state"] in ("SUCCEEDED", "FAILED"), 300)
    assert a_done["state"] == "SUCCEEDED", a_done.get("message")
    events = [e["event"] for e in a_done["timeline"]]
    assert "preempting" in events and "preempted" in events, events
    resumed = [e for e in a_done["timeline"] if e["event"] == "scheduled" and "resum" in e.get("detail", "")]
    assert resumed, f"the second placement does not say it resumes: {a_done['timeline']}"
    assert first_at(a_done, "preempted") < first_at(b_done, "scheduled")
    assert a_done["step"] == A_STEPS
    until_queues(shared, "nothing held once both ended", lambda q: q["team-a"]["models"]["A100"]["used"] == 0, 30)
