"""What a preempting job weighs by lost work (``shardyard.placement.worth``), on hand-built traces replayed under the
``shardyard`` policy (victims by lost work) and ``shardyard-order`` (the rule before): a job of the victims' own
priority preempts only when the wait it saves outweighs their loss, and a job holds the free GPUs it counted on while
its victims stop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.sim.cluster import parse_cluster
from shardyard.sim.engine import US, SimResult, simulate
from shardyard.sim.lost_work import WorkModel
from shardyard.sim.policies import policy_named
from shardyard.sim.trace import TraceJob

WORK = WorkModel(checkpoint_s=10, checkpoint_every_s=1800, notice_s=30, notice_share=1.0, restart_s=60)


def job(job_id: str, submit: float, gpus: int, duration: float, priority: int = 0, **fields: Any) -> TraceJob:
    return TraceJob(job_id, submit, gpus, "A100", duration, priority, DEFAULT_TFLOPS["A100"], **fields)


def run(trace: Sequence[TraceJob], cluster: str, name: str) -> SimResult:
    nodes = parse_cluster(cluster)
    return simulate(trace, nodes, policy_named(name, nodes), name=name, work=WORK)


def starts(result: SimResult) -> dict[str, float | None]:
    return {o.job.job_id: None if o.first_start_us is None else o.first_start_us / US for o in result.outcomes}


class TestWorth:
    """``long`` (4 GPUs, priority 0) holds the only node from 0; ``short`` (4 GPUs, 60 s, priority 0) arrives at
    1,000, when ``long`` has run past the minimum run time into a later LAS queue, so ``short`` outranks it. Stopping
    ``long`` loses 4 x (1,000 s since its start + 60 s restart) = 4,240 GPU-s."""

    SHORT = job("short", 1000, 4, 60)

    def test_a_short_wait_is_not_worth_the_victims_loss(self) -> None:
        # long declares it ends at 1,100: short would wait 100 s, 4 x 100 = 400 GPU-s < 4,240
        trace = (job("long", 0, 4, 1100, expected_duration_s=1100), self.SHORT)

        result = run(trace, "A100:4x1", "shardyard")

        assert starts(result) == {"long": 0, "short": 1100}
        assert result.preemptions == 0

    def test_the_rule_before_preempts_regardless(self) -> None:
        trace = (job("long", 0, 4, 1100, expected_duration_s=1100), self.SHORT)

        result = run(trace, "A100:4x1", "shardyard-order")

        assert starts(result) == {"long": 0, "short": 1010}
        assert result.preemptions == 1

    def test_a_long_wait_is_worth_it(self) -> None:
        # long declares a day: short would wait 85,400 s, far more than the loss
        trace = (job("long", 0, 4, 86_400, expected_duration_s=86_400), self.SHORT)

        result = run(trace, "A100:4x1", "shardyard")

        assert starts(result) == {"long": 0, "short": 1010}
        assert result.preemptions == 1

    def test_a_wait_shorter_than_the_victims_delay_is_not_worth_it(self) -> None:
        """Four 1-GPU gangs declared to end at 8,000; ``hour`` (4 GPUs, an hour) arrives at 4,000, when they have run
        past the first LAS queue, and would wait 4,000 s: its 4 x 4,000 GPU-s outweigh their loss (4 x 460, from
        their checkpoint at 3,600), but each of the four would wait about the hour ``hour`` runs and restart, 4 x
        3,660 s of delay against the 4,000 s it saves: the average job would end later (the rule before: 3,670 s
        later each, and 4,390 s earlier for ``hour``)."""
        trace = (
            *(job(f"gang-{i}", 0, 1, 8000, expected_duration_s=8000) for i in range(4)),
            job("hour", 4000, 4, 3600, expected_duration_s=3600),
        )

        result = run(trace, "A100:4x1", "shardyard")

        assert starts(result)["hour"] == 8000
        assert result.preemptions == 0
        assert run(trace, "A100:4x1", "shardyard-order").preemptions == 4

    def test_a_higher_priority_never_weighs(self) -> None:
        trace = (job("long", 0, 4, 1100, expected_duration_s=1100), job("vip", 1000, 4, 60, priority=500))

        result = run(trace, "A100:4x1", "shardyard")

        assert starts(result)["vip"] == 1010 and result.preemptions == 1


class TestRoom:
    """Two nodes of 4 GPUs: ``half`` (2 GPUs) takes half of one from 0, ``wide`` (4 GPUs) the other from 1. ``vip``
    (6 GPUs, priority 500) arrives at 100: it preempts ``wide`` (by either rule: the newest, and the least loss) and
    counts on the 2 free GPUs. ``small`` (2 GPUs) arrives at 105, during ``wide``'s checkpoint (100-110)."""

    TRACE = (
        job("half", 0, 2, 10_000),
        job("wide", 1, 4, 10_000),
        job("vip", 100, 6, 50, priority=500),
        job("small", 105, 2, 50),
    )

    def test_the_preemptor_holds_the_free_gpus_it_counted_on(self) -> None:
        result = run(self.TRACE, "A100:4x2", "shardyard")

        # small waits for vip to end (160), which starts at wide's release: one preemption is enough
        assert starts(result) == {"half": 0, "wide": 1, "vip": 110, "small": 160}
        assert result.preemptions == 1

    def test_without_the_hold_a_lower_job_takes_them_and_the_preemptions_go_round(self) -> None:
        """The rule before: ``small`` takes the 2 free GPUs at 105; at ``wide``'s release ``vip`` still lacks 2,
        preempts ``small``, and ``wide`` takes its node back; at ``small``'s release ``vip`` preempts ``wide`` and
        ``small`` takes its GPUs back; and so on, every 10 s, while neither makes progress (each restart is 60 s)."""
        result = run(self.TRACE, "A100:4x2", "shardyard-order")

        started = starts(result)
        assert started["small"] == 105
        assert started["vip"] is not None and started["vip"] > 1000
        assert result.preemptions > 50

    @pytest.mark.parametrize("name", ["shardyard", "shardyard-order"])
    def test_every_job_ends(self, name: str) -> None:
        result = run(self.TRACE, "A100:4x2", name)

        assert all(o.finish_us is not None for o in result.outcomes)
