"""The simulation engine on hand-computed scenarios: the real core against the FIFO and priority baselines."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.placement import cycle as placement
from shardyard.placement.model import Policy
from shardyard.sim import policies
from shardyard.sim.cluster import parse_cluster
from shardyard.sim.engine import US, SimResult, SimulationError, Start, State, simulate
from shardyard.sim.policies import POLICY_NAMES, CorePolicy, policy_named
from shardyard.sim.report import Summary, summarize
from shardyard.sim.trace import TraceJob


def job(job_id: str, submit: float, gpus: int, model: str | None, duration: float, **fields: Any) -> TraceJob:
    tflops = DEFAULT_TFLOPS[model] if model else 0.0
    return TraceJob(job_id, submit, gpus, model, duration, fields.pop("priority", 0), tflops, **fields)


def run(trace: Sequence[TraceJob], cluster: str, name: str) -> SimResult:
    nodes = parse_cluster(cluster)
    return simulate(trace, nodes, policy_named(name, nodes), name=name)


COMPARED = ("shardyard", "fifo", "priority")
"""The policies these cases compare (the figures below are theirs, in this order)."""


def summaries(trace: Sequence[TraceJob], cluster: str) -> dict[str, Summary]:
    return {name: summarize(run(trace, cluster, name)) for name in COMPARED}


def times(result: SimResult) -> dict[str, tuple[float | None, float | None]]:
    """Job id -> (first start, finish) in seconds."""
    return {
        o.job.job_id: (
            None if o.first_start_us is None else o.first_start_us / US,
            None if o.finish_us is None else o.finish_us / US,
        )
        for o in result.outcomes
    }


class TestHeadOfLineBlocking:
    """Two 4-GPU A100 nodes and one 4-GPU V100 node. j1 holds one A100 node until 100; j2 needs both A100 nodes.
    FIFO holds the small ANY jobs j3/j4 behind j2 although the V100 node is idle; the core reserves the A100 nodes
    for j2 and backfills j3/j4 on the V100 node. The priority baseline backfills too, but j5 (A100, at 60) takes
    the GPUs j2 waits for, so j2 starts only at 160."""

    CLUSTER = "A100:4x2,V100:4x1"
    TRACE = (
        job("j1", 0, 4, "A100", 100),
        job("j2", 1, 8, "A100", 100),
        job("j3", 2, 2, None, 50),
        job("j4", 3, 2, None, 50),
        job("j5", 60, 2, "A100", 100),
    )

    @pytest.mark.parametrize(
        ("name", "expected"),
        [
            pytest.param(
                "shardyard",
                {"j1": (0, 100), "j2": (100, 200), "j3": (2, 52), "j4": (3, 53), "j5": (200, 300)},
                id="shardyard",
            ),
            pytest.param(
                "fifo",
                {"j1": (0, 100), "j2": (100, 200), "j3": (100, 150), "j4": (100, 150), "j5": (200, 300)},
                id="fifo",
            ),
            pytest.param(
                "priority",
                {"j1": (0, 100), "j2": (160, 260), "j3": (2, 52), "j4": (3, 53), "j5": (60, 160)},
                id="priority",
            ),
        ],
    )
    def test_start_and_finish_times(self, name: str, expected: dict[str, tuple[float, float]]) -> None:
        assert times(run(self.TRACE, self.CLUSTER, name)) == expected

    def test_figures(self) -> None:
        got = summaries(self.TRACE, self.CLUSTER)

        # JCTs: shardyard 100+199+50+50+240, fifo 100+199+148+147+240, priority 100+259+50+50+100 (over 5 jobs)
        assert [(s.avg_jct_s, s.p99_jct_s, s.avg_wait_s, s.p99_wait_s) for s in got.values()] == [
            (127.8, 240.0, 47.8, 140.0),
            (166.8, 240.0, 86.8, 140.0),
            (111.8, 259.0, 31.8, 159.0),
        ]
        assert [(s.makespan_s, s.completed, s.preemptions, s.degraded_placements) for s in got.values()] == [
            (300.0, 5, 0, 0),
            (300.0, 5, 0, 0),
            (260.0, 5, 0, 0),
        ]
        # 1600 GPU-seconds of work on 12 GPUs
        assert got["shardyard"].gpu_utilisation == pytest.approx(1600 / (12 * 300))
        assert got["priority"].gpu_utilisation == pytest.approx(1600 / (12 * 260))


class TestPreemption:
    """``high`` (priority 500) arrives while ``low`` holds the only node: the core preempts ``low``, which
    checkpoints on notice for 10 s, keeps its remaining 90 s of work and resumes after ``high``, restarting for 60 s
    first (the lost work itself: ``test_sim_lost_work``)."""

    TRACE = (job("low", 0, 4, "A100", 100), job("high", 10, 4, "A100", 50, priority=500))

    def test_the_core_preempts_and_the_victim_resumes_with_its_remaining_work(self) -> None:
        result = run(self.TRACE, "A100:4x1", "shardyard")

        assert times(result) == {"low": (0, 220), "high": (20, 70)}
        assert result.preemptions == 1
        assert summarize(result).gpu_utilisation == pytest.approx(1.0)  # checkpoint time counts as held

    @pytest.mark.parametrize("name", ["fifo", "priority"])
    def test_baselines_never_preempt(self, name: str) -> None:
        result = run(self.TRACE, "A100:4x1", name)

        assert times(result) == {"low": (0, 100), "high": (100, 150)}
        assert result.preemptions == 0

    def test_the_cores_own_policy_knob_turns_it_off(self) -> None:
        nodes = parse_cluster("A100:4x1")

        result = simulate(self.TRACE, nodes, CorePolicy(nodes, Policy(preemption=False)), name="no-preemption")

        assert times(result) == {"low": (0, 100), "high": (100, 150)}

    def test_a_victim_that_would_end_within_its_checkpoint_finishes(self) -> None:
        trace = (job("low", 0, 4, "A100", 100), job("high", 95, 4, "A100", 50, priority=500))

        result = run(trace, "A100:4x1", "shardyard")

        assert times(result) == {"low": (0, 100), "high": (100, 150)}
        assert result.preemptions == 0


class TestDegradedOptIn:
    """j2 wants A100s but accepts a match of 0.5 after 30 s: at 31 the core places it on the V100 node (15/30 TFLOPS,
    so its 60 s of work take 120 s). The baselines wait for the A100 node."""

    TRACE = (
        job("j1", 0, 4, "A100", 100),
        TraceJob("j2", 1, 4, "A100", 60, 0, 30.0, min_match=0.5, max_wait_s=30),
    )

    def test_the_core_places_degraded_once_the_wait_is_over(self) -> None:
        result = run(self.TRACE, "A100:4x1,V100:4x1", "shardyard")

        assert times(result) == {"j1": (0, 100), "j2": (31, 151)}
        assert result.degraded_placements == 1

    @pytest.mark.parametrize("name", ["fifo", "priority"])
    def test_baselines_wait_for_a_full_match(self, name: str) -> None:
        result = run(self.TRACE, "A100:4x1,V100:4x1", name)

        assert times(result) == {"j1": (0, 100), "j2": (100, 160)}
        assert result.degraded_placements == 0


def test_the_shardyard_policy_is_the_real_core() -> None:
    assert policies.schedule is placement.schedule
    assert isinstance(policy_named("shardyard", parse_cluster("A100:1x1")), CorePolicy)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_job_that_can_never_fit_is_unfinished_and_blocks_nobody(name: str) -> None:
    trace = (job("huge", 0, 16, "A100", 10), job("small", 1, 1, "A100", 10))

    result = run(trace, "A100:8x1", name)

    assert times(result) == {"huge": (None, None), "small": (1, 11)}
    assert (summarize(result).completed, summarize(result).unfinished) == (1, 1)


def test_fifo_runs_equal_submissions_in_trace_order() -> None:
    trace = (job("b", 5, 4, "A100", 10), job("a", 5, 4, "A100", 10), job("first", 0, 4, "A100", 10))

    assert times(run(trace, "A100:4x1", "fifo")) == {"b": (10, 20), "a": (20, 30), "first": (0, 10)}


def test_priority_orders_by_priority_then_submission() -> None:
    trace = (
        job("run", 0, 4, "A100", 10),
        job("low", 1, 4, "A100", 10),
        job("high-late", 3, 4, "A100", 10, priority=9),
        job("high", 2, 4, "A100", 10, priority=9),
    )

    got = times(run(trace, "A100:4x1", "priority"))

    assert [job_id for job_id, _ in sorted(got.items(), key=lambda item: item[1])] == [
        "run",
        "high",
        "high-late",
        "low",
    ]


@pytest.mark.parametrize(
    ("action", "problem"),
    [
        pytest.param(Start("ghost", (("a100-000", (0,)),)), "not pending", id="unknown-job"),
        pytest.param(Start("j", (("a100-000", (0, 1)),)), "not 1 GPUs", id="wrong-size"),
        pytest.param(Start("j", (("nowhere", (0,)),)), "unknown node", id="unknown-node"),
        pytest.param(Start("j", (("a100-000", (7,)),)), "not free", id="busy-gpu"),
    ],
)
def test_a_policy_asking_the_impossible_is_a_simulation_error(action: Start, problem: str) -> None:
    def bad(_state: State, _now: int) -> list[Start]:
        return [action]

    with pytest.raises(SimulationError, match=problem):
        simulate([job("j", 0, 1, "A100", 1)], parse_cluster("A100:2x1"), bad, name="bad")


class TestBusyGpus:
    """The GPUs held over time (``SimResult.busy_gpus``), which ``simulate --plot`` draws: one sample per instant a
    gang took or gave back GPUs, adding up to ``busy_gpu_s``."""

    def test_fifo_behind_the_head_of_line(self) -> None:
        # j1 (4) alone until 100; then j2 (8) and j3, j4 (2 each); j3, j4 end at 150, j2 at 200 (j5 starts), j5 at 300
        result = run(TestHeadOfLineBlocking.TRACE, TestHeadOfLineBlocking.CLUSTER, "fifo")

        assert result.busy_gpus == ((0, 4), (100 * US, 12), (150 * US, 8), (200 * US, 2), (300 * US, 0))

    def test_a_checkpoint_holds_its_gpus(self) -> None:
        # low holds the node from 0, checkpoints 10-20, high runs 20-70, low restarts 70-130 and runs on to 220
        result = run(TestPreemption.TRACE, "A100:4x1", "shardyard")

        assert result.busy_gpus == ((0, 4), (20 * US, 4), (70 * US, 4), (220 * US, 0))

    @pytest.mark.parametrize("name", [n for n in POLICY_NAMES if n != "shardyard-one-queue"])
    def test_the_samples_add_up_to_the_gpu_seconds_held(self, name: str) -> None:
        result = run(TestHeadOfLineBlocking.TRACE + TestPreemption.TRACE[1:], "A100:4x2,V100:4x1", name)

        samples = result.busy_gpus
        held_us = sum((later - at) * gpus for (at, gpus), (later, _next) in itertools.pairwise(samples))
        assert held_us / US == pytest.approx(result.busy_gpu_s)
        assert [at for at, _gpus in samples] == sorted({at for at, _gpus in samples})
        assert all(0 <= gpus <= result.total_gpus for _at, gpus in samples) and samples[-1][1] == 0
