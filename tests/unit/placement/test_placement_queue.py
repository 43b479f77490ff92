"""Queue discipline of the placement core: priority with aging, reservation and backfill, preemption."""

from __future__ import annotations

from shardyard.events import NodeStatus, PendingReason
from shardyard.placement.candidate import effective_priority
from shardyard.placement.model import Place, Policy, Preempt
from tests.unit.builders import GIB, at
from tests.unit.placement_support import blocked, decide, node, pending, placed_on, running


def test_higher_priority_first() -> None:
    decisions = decide([node("a1")], [pending("low", priority=1), pending("high", priority=9)])

    assert [d.job_id for d in decisions] == ["high", "low"]
    assert isinstance(decisions[0], Place) and not isinstance(decisions[1], Place)


def test_older_first_among_equals() -> None:
    decisions = decide([node("a1")], [pending("new", ready=5), pending("old", ready=1)], now=6)

    assert isinstance(decisions[0], Place) and decisions[0].job_id == "old"


def test_aging_lifts_a_long_waiting_job_above_a_newer_higher_one() -> None:
    old = pending("old", priority=1, ready=0)
    new = pending("new", priority=5, ready=590)

    decisions = decide([node("a1")], [new, old], Policy(order="aging"), now=600)  # the aging order, not LAS

    assert effective_priority(old, Policy(), at(600)) == 11.0
    assert isinstance(decisions[0], Place) and decisions[0].job_id == "old"


def test_without_aging_priority_alone_orders() -> None:
    decisions = decide(
        [node("a1")], [pending("new", priority=5, ready=590), pending("old", priority=1)], Policy(aging_per_minute=0)
    )

    assert isinstance(decisions[0], Place) and decisions[0].job_id == "new"


class TestReservation:
    """The blocked head job holds the nodes it is closest to fitting on; smaller jobs backfill elsewhere only."""

    # a3 lacks the memory the head job needs; the small job would best-fit onto a1 (3 free) without a reservation.
    NODES = [node("a1", gpus=4, free_gpus=(1, 2, 3)), node("a3", gpus=4, free_memory_bytes=32 * GIB)]
    HEAD = pending("head", priority=9, gpu_count=4, memory_bytes=256 * GIB)
    SMALL = pending("small", priority=1, gpu_count=1, memory_bytes=16 * GIB)

    def test_small_job_backfills_only_outside_the_reservation(self) -> None:
        head, small = decide(self.NODES, [self.HEAD, self.SMALL])

        assert blocked(head).reason is PendingReason.INSUFFICIENT_MEMORY
        assert placed_on(small) == ["a3"]

    def test_without_a_blocked_head_the_small_job_best_fits(self) -> None:
        (small,) = decide(self.NODES, [self.SMALL])

        assert placed_on(small) == ["a1"]

    def test_small_job_waits_when_only_reserved_nodes_remain(self) -> None:
        head, small = decide(self.NODES[:1], [self.HEAD, self.SMALL])

        assert blocked(head).reason is PendingReason.INSUFFICIENT_GPUS
        assert blocked(small).reason is PendingReason.RESERVED_FOR_HIGHER_PRIORITY
        assert blocked(small).node_counts == {"reserved for a higher-priority job": 1}

    def test_no_reservation_policy_lets_small_jobs_backfill_anywhere(self) -> None:
        _head, small = decide(self.NODES[:1], [self.HEAD, self.SMALL], Policy(reservations=0))

        assert placed_on(small) == ["a1"]

    def test_a_job_that_can_never_fit_reserves_nothing(self) -> None:
        never = pending("never", priority=9, gpu_count=16)

        _never, small = decide(self.NODES[:1], [never, self.SMALL])

        assert isinstance(small, Place)


class TestPreemption:
    NODE = node("a1", gpus=2, free_gpus=())
    LOW = running("low", ("a1", (0, 1)), priority=1)
    VIP = pending("vip", priority=9)

    def test_higher_priority_job_preempts_a_lower_one(self) -> None:
        decisions = decide([self.NODE], [self.VIP], gangs=(self.LOW,))

        assert decisions[0] == Preempt("low", "vip")
        assert blocked(decisions[1]).reason is PendingReason.PREEMPTING
        assert "preempting low" in blocked(decisions[1]).message

    def test_only_as_many_victims_as_needed_lowest_priority_most_recent_first(self) -> None:
        """The victim order (``Policy.victims="order"``, the rule before lost work was counted)."""
        gangs = (
            running("p2-old", ("a1", (0,)), priority=2, started_at=at(0)),
            running("p1", ("a2", (0,)), priority=1, started_at=at(0)),
            running("p2-new", ("a3", (0,)), priority=2, started_at=at(5)),
        )
        nodes = [node(n, gpus=1, free_gpus=()) for n in ("a1", "a2", "a3")]

        decisions = decide(nodes, [self.VIP], Policy(victims="order"), gangs=gangs, now=10)

        assert [d for d in decisions if isinstance(d, Preempt)] == [Preempt("p1", "vip"), Preempt("p2-new", "vip")]

    def test_equal_or_higher_priority_is_never_preempted(self) -> None:
        gangs = (running("peer", ("a1", (0, 1)), priority=9),)

        (decision,) = decide([self.NODE], [self.VIP], gangs=gangs)

        assert blocked(decision).reason is PendingReason.INSUFFICIENT_GPUS

    def test_non_preemptible_jobs_are_spared(self) -> None:
        gangs = (running("low", ("a1", (0, 1)), priority=1, preemptible=False),)

        (decision,) = decide([self.NODE], [self.VIP], gangs=gangs)

        assert blocked(decision).reason is PendingReason.INSUFFICIENT_GPUS

    def test_no_preemption_when_it_would_not_make_room(self) -> None:
        (decision,) = decide([self.NODE], [pending("vip", priority=9, gpu_count=3)], gangs=(self.LOW,))

        assert not isinstance(decision, Preempt)

    def test_victims_on_the_wrong_gpu_model_are_not_preempted(self) -> None:
        v100 = node("v1", "V100", gpus=2, free_gpus=())
        gangs = (running("low", ("v1", (0, 1)), priority=1),)
        a100_down = node("a9", status=NodeStatus.LOST)  # the job's kind is there, down: a wait, not NEVER_FITS

        (decision,) = decide([v100, a100_down], [self.VIP], gangs=gangs)

        assert blocked(decision).reason is PendingReason.GPU_MODEL_MISMATCH

    def test_preemption_in_flight_is_not_repeated_and_holds_the_nodes(self) -> None:
        gangs = (running("low", ("a1", (0, 1)), priority=1, preempted_by="vip"),)
        nodes = [node("a1", gpus=4, free_gpus=(2,))]

        vip, small = decide(nodes, [self.VIP, pending("small", gpu_count=1)], gangs=gangs)

        assert blocked(vip).reason is PendingReason.PREEMPTING
        assert blocked(small).reason is PendingReason.RESERVED_FOR_HIGHER_PRIORITY

    def test_preemption_can_be_switched_off(self) -> None:
        (decision,) = decide([self.NODE], [self.VIP], Policy(preemption=False), gangs=(self.LOW,))

        assert blocked(decision).reason is PendingReason.INSUFFICIENT_GPUS


def test_identical_blocked_jobs_share_one_explanation() -> None:
    jobs = [pending(f"j{i}", gpu_count=2) for i in range(3)]

    decisions = decide([node("v1", "V100")], jobs)

    assert [d.job_id for d in decisions] == ["j0", "j1", "j2"]
    assert {blocked(d).message for d in decisions} == {blocked(decisions[0]).message}
