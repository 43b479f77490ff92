"""The delay a LAS preemption's victims are expected to take (``shardyard.placement.worth.victims_delay_s``): each
waits about the shorter of the preempting job's remaining run and the wait it saves, then restarts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardyard.placement.candidate import Candidate
from shardyard.placement.index import ClusterIndex
from shardyard.placement.model import PendingJob, Policy
from shardyard.placement.worth import victims_delay_s
from tests.unit.builders import GIB, at
from tests.unit.placement_support import node, pending, running

POLICY = Policy()
INDEX = ClusterIndex([node("a", gpus=8)], POLICY)
GANGS = (running("r1", ("a", (0, 1))), running("r2", ("a", (2, 3)), restart_s=5.0))
"""Two victims: the first restarts in the policy's ``restart_s`` (60 s), the second in its measured 5 s."""


def candidate(*, run_s: float | None = None, spread: tuple[float, ...] = (), attained: float = 0.0) -> Candidate:
    job: PendingJob = replace(
        pending("w", gpu_count=4, memory_bytes=GIB, ready=1),
        expected_run_s=run_s,
        run_quantiles=spread,
        attained_gpu_s=attained,
    )
    return Candidate(job, INDEX, at(10))


def test_each_victim_waits_the_shorter_of_the_run_and_the_wait_then_restarts() -> None:
    assert victims_delay_s(candidate(run_s=300), GANGS, 1000, POLICY.restart_s) == 2 * 300 + 60 + 5
    assert victims_delay_s(candidate(run_s=3000), GANGS, 1000, POLICY.restart_s) == 2 * 1000 + 60 + 5


def test_a_spread_counts_the_run_left_beyond_what_the_job_already_ran() -> None:
    """Run times of 100 s and 2,100 s, the job 100 s into them (400 GPU-s on 4 GPUs): only the longer is left,
    2,000 s, longer than the 500 s wait."""
    job = candidate(run_s=1100, spread=(100.0, 2100.0), attained=400.0)

    assert victims_delay_s(job, GANGS, 500, POLICY.restart_s) == 2 * 500 + 60 + 5


def test_a_spread_is_averaged_over_its_samples() -> None:
    job = candidate(spread=(100.0, 300.0, 900.0))

    assert victims_delay_s(job, GANGS[:1], 500, POLICY.restart_s) == pytest.approx((100 + 300 + 500) / 3 + 60)


def test_an_unknown_run_time_weighs_nothing() -> None:
    assert victims_delay_s(candidate(), GANGS, 1000, POLICY.restart_s) is None
