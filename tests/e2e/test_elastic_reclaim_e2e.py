"""An elastic job and quota reclaim on a real cluster of two A100:2 nodes shared by two teams (issue 35), the
scheduler's resize cooldown at 5 s: team A's elastic job grows into team B's idle quota, gives those shards back when
team B reclaims it (``SHRINK_FOR_RECLAIM``: the gang re-forms smaller from its live state, nothing is checkpointed
and requeued), and keeps its core up to ``min_shards``, within its own quota, when team B asks for more."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_elastic_e2e import ended, resizes, script, training
from tests.e2e.test_placement_e2e import document, submit, until
from tests.support.cluster import cli, local_cluster

pytestmark = [pytest.mark.slow, pytest.mark.broker]

QUEUES = """
min_runtime_s: 2
starving_after_s: 600
queues:
  team-a: {cohort: lab, gpus: {A100: 2}}
  team-b: {cohort: lab, gpus: {A100: 2}}
"""


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    run_dir = tmp_path_factory.mktemp("elastic-teams")
    queues = run_dir / "queues.yaml"
    queues.write_text(QUEUES)
    options = ("--queues-file", str(queues))
    env = {"SHARDYARD_RESIZE_COOLDOWN_S": "5"}
    with local_cluster(run_dir, ("A100:2", "A100:2"), replicas=1, env=env, options=options) as started:
        yield started


def team_job(task_id: str, queue: str, count: int) -> dict[str, Any]:
    job = script(task_id, count, priority=0, seconds=600)
    job["queue"] = queue
    return job


@pytest.mark.timeout(600)
def test_an_elastic_gang_gives_back_what_it_borrowed_when_the_lender_reclaims_and_keeps_its_core(shared: Path) -> None:
    grower = document(
        "a-elastic",
        queue="team-a",
        shard_count=2,
        elasticity={"min_shards": 2, "max_shards": 4},
        resource_requirements={"gpu": {"count": 2, "model": "A100"}, "memory": "2GiB", "cpu_cores": 2},
        training={"max_steps": 100_000, "batch_size": 2},
        sync_interval=1,
    )
    submit(shared, grower)
    # Team B's quota is idle: team A's gang grows into it once past the cooldown.
    grown = until(shared, "a-elastic", training(2, 4), 180)
    assert resizes(grown)[0]["event"] == "resized 2 -> 4", grown["timeline"][-6:]

    # Team B wants its quota back: the borrowed shards go, the gang trains on at 2.
    submit(shared, team_job("b-first", "team-b", 2))
    until(shared, "b-first", lambda j: j["state"] == "RUNNING", 120)
    shrunk = until(shared, "a-elastic", training(3, 2), 120)
    reclaim = resizes(shrunk)[1]
    assert reclaim["event"] == "resized 4 -> 2" and "SHRINK_FOR_RECLAIM for b-first" in reclaim["detail"], reclaim
    assert not [e for e in shrunk["timeline"] if e["event"] in ("preempting", "preempted", "recovering")]

    # Team B at its quota asks for more: team A's core is within team A's own quota, and is kept.
    submit(shared, team_job("b-second", "team-b", 2))
    waiting = until(shared, "b-second", lambda j: j["state"] == "READY" and j["reason"], 60)
    assert waiting["reason"] == "QUOTA_EXCEEDED", waiting
    held = until(shared, "a-elastic", lambda j: j["state"] == "RUNNING", 30)
    assert held["attempt"] == 3 and len(held["placements"]) == 2, held["timeline"][-6:]

    for job_id in ("b-second", "b-first", "a-elastic"):
        assert cli("cancel", job_id, "--wait", run_dir=shared).returncode == 0
    ledger = until(shared, "a-elastic", ended, 60)["goodput"]
    assert ledger["recomputed_s"] == 0, ledger
