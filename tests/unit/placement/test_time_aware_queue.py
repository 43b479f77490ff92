"""The time-aware queue: reservations from a time with backfill before it, least-attained-service order, and LAS
preemption with its churn bound."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from shardyard.events import PendingReason
from shardyard.placement.candidate import Candidate, outranks, pending_queue, queue_key, running_queue
from shardyard.placement.index import ClusterIndex
from shardyard.placement.model import Decision, PendingJob, Place, Policy, Preempt, RunningJob
from shardyard.placement.victims import outranked, victim_order
from tests.unit.builders import GIB, at
from tests.unit.placement_support import blocked, decide, node, pending, placed_on, running

HOUR = 3600.0


class TestBlockedWideJob:
    """A short job that needs the whole cluster holds a reservation from when the running gangs are expected to
    end; until then a later job backfills onto the reserved nodes only if it is expected to end before that."""

    PORTS = tuple(range(29500, 29508))
    NODES = [
        node("a1", gpus=4, free_gpus=(2, 3), rendezvous_ports=PORTS),
        node("a2", gpus=4, free_gpus=(1, 2, 3), rendezvous_ports=PORTS),
    ]
    NOW = 100.0
    GANGS = (
        running("r1", ("a1", (0,)), ("a1", (1,)), priority=5, expected_end=at(NOW + HOUR)),
        running("r2", ("a2", (0,)), priority=5, expected_end=at(NOW + HOUR / 2)),
    )
    WIDE = pending("wide", priority=5, gpu_count=8, memory_bytes=8 * GIB, ready=0)

    @staticmethod
    def later(job_id: str, expected_run_s: float | None, ready: float = 10) -> object:
        return replace(
            pending(job_id, priority=5, gpu_count=1, memory_bytes=GIB, ready=ready), expected_run_s=expected_run_s
        )

    def decide(self, *jobs: object, gangs: tuple[object, ...] | None = None, policy: Policy | None = None) -> list:
        return decide(
            self.NODES, [self.WIDE, *jobs], policy, now=self.NOW, gangs=self.GANGS if gangs is None else gangs
        )  # type: ignore[arg-type]

    def test_the_wide_job_reserves_from_when_the_last_gang_on_its_nodes_ends(self) -> None:
        (wide,) = self.decide()

        assert blocked(wide).reason is PendingReason.INSUFFICIENT_GPUS
        assert blocked(wide).estimated_start == at(self.NOW + HOUR)

    def test_a_job_that_ends_before_the_reservation_backfills_onto_its_nodes(self) -> None:
        wide, short = self.decide(self.later("short", HOUR / 2))

        assert isinstance(short, Place) and placed_on(short)[0] in {"a1", "a2"}
        assert blocked(wide).estimated_start == at(self.NOW + HOUR)

    def test_backfill_respects_the_reservation_time(self) -> None:
        _wide, long, unknown, short = self.decide(
            self.later("long", 2 * HOUR), self.later("unknown", None), self.later("short", HOUR - 1, ready=20)
        )

        assert blocked(long).reason is PendingReason.RESERVED_FOR_HIGHER_PRIORITY  # would end after it starts
        assert blocked(unknown).reason is PendingReason.RESERVED_FOR_HIGHER_PRIORITY  # no expectation: no backfill
        assert isinstance(short, Place)

    def test_many_short_jobs_backfill_while_the_reservation_waits(self) -> None:
        shorts = [self.later(f"s{i}", 600, ready=10 + i) for i in range(5)]

        decisions = self.decide(*shorts)

        assert blocked(decisions[0]).job_id == "wide"
        assert sum(isinstance(d, Place) for d in decisions[1:]) == 5  # every free GPU: 2 on a1, 3 on a2

    def test_a_gang_without_an_expected_end_makes_the_start_unknown_and_nothing_backfills(self) -> None:
        gangs = (self.GANGS[0], replace(self.GANGS[1], expected_end=None))

        wide, short = self.decide(self.later("short", 60), gangs=gangs)

        assert blocked(wide).estimated_start is None
        assert blocked(short).reason is PendingReason.RESERVED_FOR_HIGHER_PRIORITY

    def test_a_gang_past_its_expected_end_is_expected_to_run_as_long_again_as_it_has(self) -> None:
        """Heavy-tailed run times: a gang that outran its estimate is likely to run on for a while. Counting it as
        ending any moment would stop every backfill onto its nodes for as long as it overruns (days, for the one
        in ten that outruns a p90 estimate), and leave those GPUs idle."""
        late = (
            replace(self.GANGS[0], expected_end=at(self.NOW - 1)),
            replace(self.GANGS[1], expected_end=at(self.NOW - 1)),
        )  # both started at 0: 100 s ago

        wide, short, long = self.decide(self.later("short", 60), self.later("long", 150, ready=20), gangs=late)

        assert blocked(wide).estimated_start == at(self.NOW + self.NOW)
        assert isinstance(short, Place)  # ends at 160, before the reservation at 200
        assert blocked(long).reason is PendingReason.RESERVED_FOR_HIGHER_PRIORITY  # would end at 250

    def test_without_backfill_the_reserved_nodes_wait(self) -> None:
        _wide, short = self.decide(self.later("short", 60), policy=Policy(backfill=False))

        assert blocked(short).reason is PendingReason.RESERVED_FOR_HIGHER_PRIORITY


class TestLeastAttainedService:
    def test_a_new_job_goes_ahead_of_an_older_one_that_already_ran_long(self) -> None:
        ran = replace(pending("ran", ready=0), attained_gpu_s=2 * HOUR)
        new = pending("new", ready=50)

        decisions = decide([node("a1")], [ran, new], now=60)  # room for one of them

        assert isinstance(decisions[0], Place) and decisions[0].job_id == "new"

    def test_a_job_that_waited_twice_as_long_as_it_ran_is_back_in_the_first_queue(self) -> None:
        job = replace(pending("ran", ready=0, gpu_count=1), attained_gpu_s=HOUR)
        policy = Policy()

        assert pending_queue(job, policy, at(2 * HOUR - 1)) == 1
        assert pending_queue(job, policy, at(2 * HOUR)) == 0

    def test_priority_comes_before_attained_service(self) -> None:
        policy = Policy()
        high = replace(pending("high", priority=9), attained_gpu_s=100 * HOUR)

        assert queue_key(high, policy, at(1)) < queue_key(pending("low", priority=1), policy, at(1))


class TestLasPreemption:
    NODES = [node("a1", gpus=2, free_gpus=())]

    NEW = pending("new", priority=5, gpu_count=2, ready=HOUR - 5)

    def gang(self, started: float, attained: float = 0.0) -> RunningJob:
        return running("long", ("a1", (0,)), ("a1", (1,)), priority=5, started_at=at(started), attained_gpu_s=attained)

    def decide(self, job: PendingJob, gang: RunningJob, policy: Policy | None = None) -> list[Decision]:
        return decide(self.NODES, [job], policy, now=HOUR, gangs=(gang,))

    def test_a_gang_past_a_queue_threshold_is_preempted_for_a_new_job_of_its_priority(self) -> None:
        now = HOUR
        decisions = decide(
            self.NODES, [pending("new", priority=5, gpu_count=2, ready=now - 5)], now=now, gangs=(self.gang(0),)
        )  # type: ignore[arg-type]

        assert [type(d) for d in decisions] == [Preempt, type(decisions[-1])]
        assert decisions[0] == Preempt("long", "new")
        assert blocked(decisions[-1]).reason is PendingReason.PREEMPTING

    def test_not_before_it_ran_its_minimum_time_in_this_attempt(self) -> None:
        now = HOUR
        gang = self.gang(started=now - 60, attained=10 * HOUR)  # far past the threshold, but just restarted

        (decision,) = decide(
            self.NODES, [pending("new", priority=5, gpu_count=2, ready=now - 5)], now=now, gangs=(gang,)
        )  # type: ignore[arg-type]

        assert blocked(decision).reason is not PendingReason.PREEMPTING

    def test_not_for_a_job_that_ran_as_long(self) -> None:
        new = replace(self.NEW, attained_gpu_s=2 * HOUR)

        (decision,) = self.decide(new, self.gang(0))

        assert blocked(decision).reason is not PendingReason.PREEMPTING

    def test_the_aging_order_preempts_only_for_priority(self) -> None:
        (decision,) = self.decide(self.NEW, self.gang(0), Policy(order="aging"))

        assert blocked(decision).reason is not PendingReason.PREEMPTING


@pytest.mark.parametrize("order", ["las", "aging"])
def test_the_victim_walk_takes_exactly_the_gangs_a_job_outranks_in_victim_order(order: str) -> None:
    """``choose_victims`` walks a per-cycle order and stops early; the gangs it would take are those
    ``candidate.outranks`` allows, lowest priority, then most service, then most recently started first."""
    rng = random.Random(7)
    policy = Policy(order=order)  # type: ignore[arg-type]
    now = at(100 * HOUR)
    index = ClusterIndex([node("a1", gpus=8)], policy)
    gangs = [
        running(
            f"g{i}",
            ("a1", (0,)),
            priority=rng.choice((0, 5, 9)),
            started_at=at(100 * HOUR - rng.choice((30, 900, 5 * HOUR, 50 * HOUR))),
            attained_gpu_s=rng.choice((0.0, 2 * HOUR, 20 * HOUR, 200 * HOUR)),
            preemptible=rng.random() < 0.9,
            preempted_by="x" if rng.random() < 0.1 else None,
        )
        for i in range(60)
    ]
    walk = victim_order(gangs, policy, now)
    for priority in (0, 5, 9):
        for attained in (0.0, 2 * HOUR, 20 * HOUR):
            job = replace(pending("new", priority=priority, ready=99 * HOUR), attained_gpu_s=attained)
            allowed = [g for g in gangs if g.preemptible and g.preempted_by is None and outranks(job, g, policy, now)]
            expected = sorted(
                allowed,
                key=lambda g: (g.priority, -running_queue(g, policy, now), -g.started_at.timestamp(), g.job_id),
            )

            assert list(outranked(Candidate(job, index, now), walk, policy, now)) == expected
