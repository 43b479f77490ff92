"""Every job waiting on capacity gets an estimated start from the plan, allowing for the jobs ahead of it."""

from __future__ import annotations

from dataclasses import replace

from shardyard.events import PendingReason
from shardyard.placement.model import PendingJob, Place, Policy
from tests.unit.builders import GIB, at
from tests.unit.placement_support import blocked, decide, node, pending, running

NOW = 100.0
PORTS = tuple(range(29500, 29508))


def job(job_id: str, gpus: int, run_s: float | None, ready: float, **spec: object) -> PendingJob:
    return replace(
        pending(job_id, priority=5, gpu_count=gpus, memory_bytes=GIB, ready=ready, **spec), expected_run_s=run_s
    )


def holding(node_id: str, gpus: int, ends_in: float | None) -> object:
    return running(
        f"r-{node_id}",
        *((node_id, (i,)) for i in range(gpus)),
        priority=9,
        expected_end=None if ends_in is None else at(NOW + ends_in),
    )


def test_each_waiting_job_starts_after_the_jobs_ahead_of_it() -> None:
    """One node of 4 GPUs, busy for 100 s more: the first job reserves it, then every later one queues behind."""
    nodes = [node("a", gpus=4, free_gpus=(), rendezvous_ports=PORTS)]
    gangs = (holding("a", 4, 100.0),)

    first, second, third, fourth = decide(
        nodes,
        [job("first", 4, 50, 1), job("second", 4, 30, 2), job("third", 2, None, 3), job("fourth", 4, 10, 4)],
        now=NOW,
        gangs=gangs,  # type: ignore[arg-type]
    )

    assert blocked(first).estimated_start == at(NOW + 100)  # its reservation's: when the gang ends
    assert blocked(second).estimated_start == at(NOW + 150)  # after first's 50 s
    assert blocked(third).estimated_start == at(NOW + 180)  # after second's 30 s
    assert blocked(fourth).estimated_start is None  # third may run for ever: not within the plan


def test_a_short_job_is_planned_into_a_gap_before_a_later_start() -> None:
    """Conservative backfill in the plan: two GPUs free now and for 100 s; a 4-GPU job needs the node whole from
    100 s. A 2-GPU job of 60 s fits the gap; one of 200 s waits for the wide one."""
    nodes = [node("a", gpus=4, free_gpus=(2, 3), rendezvous_ports=PORTS)]
    gangs = (running("r", ("a", (0,)), ("a", (1,)), priority=9, expected_end=at(NOW + 100)),)

    wide, long, short = decide(
        nodes,
        [job("wide", 4, 50, 1), job("long", 2, 200, 2), job("short", 2, 60, 3)],
        now=NOW,
        gangs=gangs,  # type: ignore[arg-type]
    )

    assert blocked(wide).estimated_start == at(NOW + 100)
    assert blocked(long).estimated_start == at(NOW + 150)  # after wide
    assert isinstance(short, Place)  # the core backfilled it: it ends before wide's reservation


def test_gangs_placed_this_cycle_hold_their_gpus_for_their_expected_run() -> None:
    nodes = [node("a", gpus=4, rendezvous_ports=PORTS)]

    placed, waiting = decide(nodes, [job("placed", 4, 70, 1), job("waiting", 4, 10, 2)], now=NOW)

    assert isinstance(placed, Place)
    assert blocked(waiting).estimated_start == at(NOW + 70)


def test_a_job_waiting_on_something_else_than_capacity_gets_no_estimate() -> None:
    nodes = [node("a", gpus=4, rendezvous_ports=PORTS)]

    (missing,) = decide(nodes, [job("missing", 1, 10, 1, dataset_path="/data/datasets/absent")], now=NOW)

    assert blocked(missing).reason is PendingReason.WAITING_FOR_ARTIFACT
    assert blocked(missing).estimated_start is None


def test_the_plan_covers_only_the_first_start_estimates_jobs() -> None:
    nodes = [node("a", gpus=4, free_gpus=(), rendezvous_ports=PORTS)]
    gangs = (holding("a", 4, 100.0),)
    jobs = [job(f"j{i}", 4, 10, i) for i in range(1, 5)]

    decisions = decide(nodes, jobs, Policy(start_estimates=2), now=NOW, gangs=gangs)  # type: ignore[arg-type]

    assert [blocked(d).estimated_start for d in decisions] == [at(NOW + 100), at(NOW + 110), None, None]


def test_a_gang_with_no_expected_end_never_frees_its_gpus_in_the_plan() -> None:
    nodes = [
        node("a", gpus=4, free_gpus=(), rendezvous_ports=PORTS),
        node("b", gpus=4, free_gpus=(), rendezvous_ports=PORTS),
    ]
    gangs = (holding("a", 4, None), holding("b", 4, 40.0))

    first, second = decide(nodes, [job("first", 4, 10, 1), job("second", 8, 10, 2)], now=NOW, gangs=gangs)  # type: ignore[arg-type]

    assert blocked(first).estimated_start == at(NOW + 40)  # on b
    assert blocked(second).estimated_start is None  # needs a too
