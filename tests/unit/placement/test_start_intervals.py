"""A waiting job's start as an interval: the plan drawn over samples of the gangs' run times (p50 and p90)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardyard.placement.easy import NEVER, Job, easy_starts
from shardyard.placement.estimates import LEVELS, DurationEstimates, EstimateKey, quantiles
from shardyard.placement.intervals import Queued, gang_end, plan_intervals
from shardyard.placement.model import PendingJob, Policy
from tests.unit.builders import GIB, at
from tests.unit.placement_support import blocked, decide, node, pending, running

NOW = 1000.0
PORTS = tuple(range(29500, 29508))
KEY = ("A100", 312.0)
UNIFORM = tuple(100.0 * (i + 1) for i in range(20))
"""A gang's whole run: 100 s to 2,000 s, evenly (its p50 is about 1,000 s, its p90 about 1,800 s)."""


def job(job_id: str, gpus: int, run_s: float | None, ready: float, spread: tuple[float, ...] = ()) -> PendingJob:
    return replace(
        pending(job_id, priority=5, gpu_count=gpus, memory_bytes=GIB, ready=ready),
        expected_run_s=run_s,
        run_quantiles=spread,
    )


def test_the_p90_of_a_start_behind_a_gang_of_spread_run_times_is_later_than_its_p50() -> None:
    """One node, held by a gang that started 100 s ago and runs 100 s to 2,000 s: the job waiting for it starts
    when the gang ends, so its p50 is the gang's median end and its p90 the gang's p90 end (from now)."""
    nodes = [node("a", gpus=4, free_gpus=(), rendezvous_ports=PORTS)]
    gang = running("r", *(("a", (i,)) for i in range(4)), priority=9, started_at=at(NOW - 100), run_quantiles=UNIFORM)

    (verdict,) = decide(nodes, [job("w", 4, 60, 1)], now=NOW, gangs=(gang,))

    p50, p90 = blocked(verdict).estimated_start, blocked(verdict).estimated_start_p90
    assert p50 is not None and p90 is not None
    # The gang's ends after the 100 s it ran: 19 levels of 200 s..2,000 s, drawn evenly over 32 samples.
    assert at(NOW + 800) <= p50 <= at(NOW + 1100)
    assert at(NOW + 1500) <= p90 <= at(NOW + 1900)


def test_the_same_cycle_gives_the_same_interval_again() -> None:
    nodes = [node("a", gpus=4, free_gpus=(), rendezvous_ports=PORTS)]
    gang = running("r", *(("a", (i,)) for i in range(4)), priority=9, started_at=at(NOW - 100), run_quantiles=UNIFORM)
    jobs = [job("w1", 2, None, 1, UNIFORM), job("w2", 4, None, 2, UNIFORM)]

    first = decide(nodes, jobs, now=NOW, gangs=(gang,))
    again = decide(nodes, jobs, now=NOW, gangs=(gang,))

    assert [(blocked(d).estimated_start, blocked(d).estimated_start_p90) for d in first] == [
        (blocked(d).estimated_start, blocked(d).estimated_start_p90) for d in again
    ]


def test_without_spreads_the_interval_is_the_point_plan() -> None:
    """No gang or job has a spread: every sample is the same plan, so p50 = p90 = the plan's start."""
    nodes = [node("a", gpus=4, free_gpus=(), rendezvous_ports=PORTS)]
    gang = running("r", *(("a", (i,)) for i in range(4)), priority=9, expected_end=at(NOW + 100))

    first, second = decide(nodes, [job("first", 4, 50, 1), job("second", 4, 30, 2)], now=NOW, gangs=(gang,))

    assert blocked(first).estimated_start == blocked(first).estimated_start_p90 == at(NOW + 100)
    assert blocked(second).estimated_start == blocked(second).estimated_start_p90 == at(NOW + 150)


def test_a_gang_past_all_its_run_times_runs_on_as_long_again() -> None:
    gang = running("r", ("a", (0,)), started_at=at(NOW - 5000), run_quantiles=UNIFORM)
    assert gang_end(gang, at(NOW), 0.5) == pytest.approx(5000.0)


def test_a_gang_is_drawn_from_its_runs_longer_than_it_has_run() -> None:
    gang = running("r", ("a", (0,)), started_at=at(NOW - 1500), run_quantiles=UNIFORM)
    ends = [gang_end(gang, at(NOW), u) for u in (0.0, 0.5, 0.99)]
    assert ends == [100.0, 300.0, 500.0]  # of 1,600..2,000 s: 100..500 s from now


def test_a_gang_without_a_spread_or_an_expected_end_holds_its_gpus_for_ever() -> None:
    """The job behind it is not within the plan: no estimate."""
    gang = running("r", ("a", (0,)), started_at=at(NOW - 10))
    waiting = [Queued("w", 1, [KEY], (), 10.0)]
    (interval,) = plan_intervals({KEY: 0}, [(gang, {KEY: 1})], waiting, now=at(NOW), policy=Policy()).values()
    assert interval.p50 is None and interval.p90 is None


def test_the_queue_is_played_forward_by_easy_backfill() -> None:
    """4 GPUs, 2 free now and 2 from 100 s. A wide job (4) reserves from 100 s; a 2-GPU job of 60 s fits before it
    and starts now; one of 200 s would delay it and waits for the wide job's end; a later 2-GPU job of 50 s
    starts in the gap the 60-s job leaves, at 60 s."""
    starts = easy_starts(
        {KEY: 2},
        [(100.0, KEY, 2)],
        [Job(4, [KEY], 50.0), Job(2, [KEY], 200.0), Job(2, [KEY], 60.0), Job(2, [KEY], 30.0)],
    )
    assert starts == [100.0, 150.0, 0.0, 60.0]


def test_a_job_behind_one_that_holds_its_gpus_for_ever_never_starts() -> None:
    assert easy_starts({KEY: 0}, [], [Job(1, [KEY], 10.0)]) == [NEVER]
    assert easy_starts({KEY: 1}, [], [Job(1, [KEY], NEVER), Job(1, [KEY], 10.0)]) == [0.0, NEVER]


class TestRunSpread:
    KEY = EstimateKey("fine_tune", "A100", 2, "team-a")

    def test_a_declared_run_time_is_the_prior_median_with_a_spread(self) -> None:
        spread = DurationEstimates().spread(self.KEY, 1000.0)
        assert len(spread) == len(LEVELS)
        assert spread[9] < 1000.0 < spread[10]  # the median is the declaration
        assert 1200.0 < spread[17] < 1350.0  # p90 of a log-normal of sigma 0.2: 1.29x

    def test_a_key_s_declared_jobs_teach_how_their_declarations_err(self) -> None:
        estimates = DurationEstimates(min_samples=3)
        for ran in (500.0, 500.0, 500.0):
            estimates.observe(self.KEY, ran, declared_s=1000.0)  # this team's jobs run half what they declare
        assert estimates.spread(self.KEY, 2000.0) == tuple([1000.0] * len(LEVELS))
        assert estimates.spread(self.KEY) == ()  # undeclared jobs learn from undeclared runs alone

    def test_a_team_s_runs_come_before_other_teams(self) -> None:
        estimates = DurationEstimates(min_samples=2)
        for ran in (10.0, 20.0):
            estimates.observe(EstimateKey("fine_tune", "A100", 2, "team-b"), ran)
        for ran in (100.0, 200.0):
            estimates.observe(self.KEY, ran)
        assert estimates.spread(self.KEY) == quantiles([100.0, 200.0])
        assert estimates.spread(EstimateKey("fine_tune", "A100", 2, "team-c")) == quantiles([10.0, 20.0, 100.0, 200.0])

    def test_quantiles_interpolate_between_samples(self) -> None:
        assert quantiles([5.0]) == tuple([5.0] * len(LEVELS))
        spread = quantiles([0.0, 100.0])
        assert spread[0] == 0.0 and spread[-1] == 100.0 and spread == tuple(sorted(spread))
