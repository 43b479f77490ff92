"""The monitor's queue rows (``/api/queues``, ``shardyard queues``): the scheduler's ledger over the gangs placed
now, so borrowed and lent GPUs, pending jobs, fair shares and starvation read as placement counts them."""

from typing import Any

from shardyard.cli.queues import render
from shardyard.events import QueuesConfigured
from shardyard.lifecycle import JobState
from shardyard.monitor.jobs import JobView
from shardyard.monitor.queues import queue_rows, queues_json
from shardyard.quotas import parse_queues
from tests.unit.builders import at, gpus, node_state

QUEUES = """
starving_after_s: 60
queues:
  team-a: {cohort: lab, gpus: {A100: 2}}
  team-b: {cohort: lab, gpus: {A100: 2}, weight: 2}
"""
NODES = [node_state("node-a", gpus=gpus("A100", 2)), node_state("node-b", gpus=gpus("A100", 2))]


def configured() -> QueuesConfigured:
    return QueuesConfigured(
        occurred_at=at(0), config=parse_queues(QUEUES), version="a" * 64, source="q.yaml", published_by="test"
    )


def job(job_id: str, queue: str, state: JobState, *shards: tuple[str, int], need: int = 1, **more: Any) -> JobView:
    view = JobView(job_id, state=state)
    view.spec = {"queue": queue, "gpu_count": need, "gpu_model": "A100", "cpu_cores": 4, "memory_bytes": 1, **more}
    view.placements = [
        {"node_id": node, "gpu_indices": [index], "gpu_model": "A100", "shard_index": i}
        for i, (node, index) in enumerate(shards)
    ]
    return view


def test_a_borrowing_queue_shows_what_it_borrows_and_its_lender_what_it_lends() -> None:
    jobs = [
        job("big", "team-a", JobState.RUNNING, ("node-a", 0), ("node-a", 1), ("node-b", 0), need=3),
        job("waits", "team-a", JobState.READY, need=2),
    ]

    rows = queue_rows(configured(), jobs, NODES)

    a, b = rows["team-a"], rows["team-b"]
    assert a.models["A100"] == {"nominal": 2, "used": 3, "borrowed": 1, "lent": 0, "pending": 2}
    assert b.models["A100"] == {"nominal": 2, "used": 0, "borrowed": 0, "lent": 1, "pending": 0}
    assert (a.running_jobs, a.pending_jobs, b.pending_jobs) == (1, 1, 0)
    assert a.fair_share == 0.75 and b.fair_share == 0.0  # 3 of 4 equal GPUs, weight 1


def test_a_queue_whose_job_fits_its_nominal_but_waits_is_starving_since_its_pending_reason() -> None:
    borrower = job("big", "team-a", JobState.RUNNING, ("node-a", 0), ("node-a", 1), ("node-b", 0), ("node-b", 1))
    lender = job("small", "team-b", JobState.READY, need=2)
    lender.reason_since = at(30)
    too_big = job("huge", "team-a", JobState.READY, need=2)  # team-a holds 4 of its 2: not waiting for its nominal
    too_big.reason_since = at(10)

    rows = queue_rows(configured(), [borrower, lender, too_big], NODES)

    assert rows["team-b"].starving_since == at(30)
    assert rows["team-a"].starving_since is None


def test_a_queue_no_file_configures_is_listed_without_quota() -> None:
    rows = queue_rows(None, [job("j", "research", JobState.RUNNING, ("node-a", 0))], NODES)

    assert sorted(rows) == ["default", "research"]
    assert rows["research"].models["A100"]["used"] == 1 and rows["research"].models["A100"]["nominal"] == 0


def test_the_table_lists_each_queue_and_model() -> None:
    answer = queues_json(
        configured(), queue_rows(configured(), [job("j", "team-b", JobState.RUNNING, ("node-b", 1))], NODES)
    )

    shown = render(answer, wide=True)

    assert "q.yaml" in shown
    line = next(row for row in shown.splitlines() if row.startswith("team-b"))
    assert line.split()[:8] == ["team-b", "A100", "2", "1", "0", "0", "0", "0"], line
    assert "lab" in line
