"""Elastic jobs in the simulator (issue 35): a gang grows into idle GPUs, gives its surplus back when a job waits,
keeps its work across resizes, and its GPU-seconds are counted at the sizes it held. Figures by hand; the work
model is ``sim.gang``'s (linear scaling, each resize 5 s without progress)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.sim.cluster import parse_cluster
from shardyard.sim.engine import US, Action, Resize, SimResult, SimulationError, Start, State, simulate
from shardyard.sim.generate import generate, mark_elastic
from shardyard.sim.lost_work import WorkModel
from shardyard.sim.policies import policy_named
from shardyard.sim.trace import TraceJob


def job(job_id: str, submit: float, gpus: int, duration: float, **fields: Any) -> TraceJob:
    return TraceJob(job_id, submit, gpus, "V100", duration, fields.pop("priority", 0), DEFAULT_TFLOPS["V100"], **fields)


def elastic(job_id: str, submit: float, gpus: int, duration: float, low: int, high: int) -> TraceJob:
    return job(job_id, submit, gpus, duration, min_shards=low, max_shards=high)


class Recorder:
    """A policy by name, with the sizes its resizes asked for: (time s, job id, GPUs)."""

    def __init__(self, name: str, cluster: str) -> None:
        self.nodes = parse_cluster(cluster)
        self.policy = policy_named(name, self.nodes)
        self.resized: list[tuple[float, str, int]] = []

    def __call__(self, state: State, now_us: int) -> Sequence[Action]:
        actions = self.policy(state, now_us)
        for action in actions:
            if isinstance(action, Resize):
                self.resized.append((now_us / US, action.job_id, sum(len(g) for _n, g in action.shards)))
        return actions

    def run(self, trace: Sequence[TraceJob], work: WorkModel | None = None) -> SimResult:
        return simulate(trace, self.nodes, self, name="shardyard", work=work)


def times(result: SimResult) -> dict[str, tuple[float | None, float | None]]:
    return {
        o.job.job_id: (
            None if o.first_start_us is None else o.first_start_us / US,
            None if o.finish_us is None else o.finish_us / US,
        )
        for o in result.outcomes
    }


def held_gpu_s(result: SimResult) -> float:
    """The GPUs held over time (``busy_gpus``), integrated."""
    samples = result.busy_gpus
    return sum(held * (later - at) for (at, held), (later, _) in itertools.pairwise(samples)) / US


def test_a_lone_elastic_job_grows_into_the_idle_cluster() -> None:
    """4 GPUs preferred on 16 idle ones, at most 16: it starts at 4 and grows to 16 at once; its 1,000 s x 4 GPUs
    of work take 1,000 x 4 / 16 = 250 s, after the 5 s resize."""
    policy = Recorder("shardyard", "V100:8x2")

    result = policy.run([elastic("a", 0, 4, 1000, 2, 16)])

    assert times(result) == {"a": (0.0, 255.0)}
    assert policy.resized == [(0.0, "a", 16)]
    assert result.resizes == 1
    assert result.busy_gpu_s == held_gpu_s(result) == 16 * 255
    assert (result.spent.productive, result.spent.resizing) == (4000 * US, 16 * 5 * US)


def test_an_arrival_shrinks_it_back_and_starts_at_once() -> None:
    """b (12 GPUs) arrives at 100 on the 16 GPUs a holds: a shrinks to its preferred 4 and b starts at 100; when b
    ends at 150, a grows to 16 again. a's 4,000 GPU-s of work: 16 x 95 s (after the first resize) + 4 x 45 s + 16 x
    143.75 s: it ends at 155 + 143.75."""
    policy = Recorder("shardyard", "V100:8x2")

    result = policy.run([elastic("a", 0, 4, 1000, 2, 16), job("b", 100, 12, 50)])

    assert times(result) == {"a": (0.0, 298.75), "b": (100.0, 150.0)}
    assert policy.resized == [(0.0, "a", 16), (100.0, "a", 4), (150.0, "a", 16)]
    assert result.resizes == 3
    assert result.spent.productive == (4000 + 12 * 50) * US
    assert result.busy_gpu_s == held_gpu_s(result) == 16 * 298.75  # all 16 GPUs held from 0 to the end


def test_a_shrink_that_does_not_make_room_is_followed_by_a_preemption_and_keeps_its_work() -> None:
    """One node of 8: a (4, grown to 8) gives 4 back when b (8 GPUs, priority 900) arrives at 100; b needs all 8,
    so the core preempts a, which checkpoints on notice (10 s) keeping its work up to 100: 5..100 at twice its
    preferred rate, 190 s of 1,000. b runs 110..160; a restarts (60 s), grows to 8 at once and ends 810 / 2 s after
    its restart."""
    policy = Recorder("shardyard", "V100:8x1")

    result = policy.run([elastic("a", 0, 4, 1000, 2, 8), job("b", 100, 8, 50, priority=900)])

    assert times(result) == {"a": (0.0, 220 + 405.0), "b": (110.0, 160.0)}
    assert [o.preemptions for o in result.outcomes] == [1, 0]
    spent = result.spent
    assert spent.productive == (4000 + 8 * 50) * US  # no work lost, none invented
    assert (spent.restart, spent.recomputed, spent.stopping) == (8 * 60 * US, 0, 4 * 10 * US)
    assert spent.resizing == 8 * 5 * US  # the first growth; the second is within the restart
    assert result.busy_gpu_s * US == spent.productive + spent.lost + spent.resizing
    assert result.busy_gpu_s == held_gpu_s(result)


@pytest.mark.parametrize("name", ["shardyard", "shardyard-order", "fifo", "priority"])
def test_work_is_conserved_across_resizes_and_busy_time_is_the_gpus_held(name: str) -> None:
    """A busy cluster, half the jobs elastic: every job ends, the productive GPU-seconds are exactly its work (no
    degraded jobs: every gang at full speed), and the GPU-seconds held are the samples' integral, split into
    productive, lost to preemption and resizing."""
    nodes = parse_cluster("V100:8x4")
    trace = mark_elastic(generate(120, 7, nodes, load=1.0, shape="helios"), 0.5, nodes)

    result = simulate(trace, nodes, policy_named(name, nodes), name=name)

    assert all(o.finish_us is not None for o in result.outcomes)
    work_us = sum(job.duration_s * job.gpus for job in trace) * US
    assert result.spent.productive == pytest.approx(work_us, rel=1e-9, abs=len(trace) * 64)
    spent = result.spent
    assert result.busy_gpu_s * US == spent.productive + spent.lost + spent.resizing
    assert result.busy_gpu_s == pytest.approx(held_gpu_s(result))
    assert (result.resizes > 0) == name.startswith("shardyard")  # the baselines run every job rigid


def test_the_baselines_run_elastic_jobs_rigid() -> None:
    nodes = parse_cluster("V100:8x4")
    rigid = generate(80, 3, nodes, load=1.0, shape="helios")
    flexible = mark_elastic(rigid, 1.0, nodes)

    def replay(trace: list[TraceJob]) -> dict[str, tuple[float | None, float | None]]:
        return times(simulate(trace, nodes, policy_named("priority", nodes), name="priority"))

    assert replay(flexible) == replay(rigid)


def test_a_gang_started_below_its_preferred_size_is_accepted_within_its_range() -> None:
    """The core starts an elastic job smaller when its preferred size does not fit: 6 GPUs free, 8 preferred, 4 at
    least: it starts at 6, at 6/8 of its preferred rate, and grows to 8 when the rigid job ends at 100: its 100 s
    of work at 8 GPUs are 67.5 done by then, the rest after the resize."""
    policy = Recorder("shardyard", "V100:8x1")

    result = policy.run([job("r", 0, 2, 100), elastic("e", 10, 8, 100, 4, 8)])

    assert times(result) == {"r": (0.0, 100.0), "e": (10.0, 105 + (100 - 90 * 6 / 8))}
    assert policy.resized == [(100.0, "e", 8)]


def start_all(trace: Sequence[TraceJob], gpus: int) -> Any:
    def policy(state: State, now_us: int) -> list[Action]:
        return [Start(job_id, (("v100-000", tuple(range(gpus))),)) for job_id in state.pending]

    return policy


@pytest.mark.parametrize(
    ("trace", "gpus", "problem"),
    [
        pytest.param([job("r", 0, 4, 10)], 2, "not 4 GPUs", id="rigid-smaller"),
        pytest.param([elastic("e", 0, 4, 10, 3, 6)], 2, r"not 3\.\.6 GPUs", id="elastic-below-min"),
        pytest.param([elastic("e", 0, 4, 10, 3, 6)], 7, r"not 3\.\.6 GPUs", id="elastic-above-max"),
    ],
)
def test_the_engine_refuses_a_start_out_of_range(trace: list[TraceJob], gpus: int, problem: str) -> None:
    nodes = parse_cluster("V100:8x1")
    with pytest.raises(SimulationError, match=problem):
        simulate(trace, nodes, start_all(trace, gpus), name="bad")


def test_the_engine_refuses_to_resize_a_rigid_gang() -> None:
    nodes = parse_cluster("V100:8x1")

    def policy(state: State, now_us: int) -> list[Action]:
        return [Start("r", (("v100-000", (0, 1)),)), Resize("r", (("v100-000", (0, 1, 2)),))]

    with pytest.raises(SimulationError, match="no running elastic gang"):
        simulate([job("r", 0, 2, 10)], nodes, policy, name="bad")


def test_the_resize_time_is_a_setting() -> None:
    policy = Recorder("shardyard", "V100:8x2")

    result = policy.run([elastic("a", 0, 4, 1000, 2, 16)], WorkModel(resize_s=20))

    assert times(result) == {"a": (0.0, 270.0)}
