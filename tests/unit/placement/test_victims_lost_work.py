"""Victims by lost work (issue 34): among the gangs a job may preempt, the cycle stops the set that loses least,
each gang's loss being its GPUs x the time since its last durable checkpoint, plus its restart cost, from the lowest
tiers (priority, then LAS queue) that make room; ties go to the lower priority, then the newest gang. Who may be
preempted at all is unchanged."""

import itertools
import random

from shardyard.placement.model import Decision, Policy, Preempt, RunningJob
from tests.unit.builders import at
from tests.unit.placement_support import decide, node, pending, running

NOW = 1000.0
POLICY = Policy(restart_s=60.0)
VIP = pending("vip", priority=9, gpu_count=1)


def preempted(decisions: list[Decision]) -> set[str]:
    return {d.job_id for d in decisions if isinstance(d, Preempt)}


def full(*names: str, gpus: int = 1) -> list:
    return [node(name, gpus=gpus, free_gpus=()) for name in names]


def test_the_gang_that_checkpointed_last_is_preempted() -> None:
    """kueue#477: of two like gangs, the one that checkpointed 10 s ago loses 10 s, the other 900 s."""
    gangs = (
        running("stale", ("a1", (0,)), priority=1, started_at=at(50), checkpointed_at=at(NOW - 900)),
        running("fresh", ("a2", (0,)), priority=1, started_at=at(0), checkpointed_at=at(NOW - 10)),
    )
    decisions = decide(full("a1", "a2"), [VIP], POLICY, gangs=gangs, now=NOW)
    assert preempted(decisions) == {"fresh"}


def test_without_a_checkpoint_the_whole_attempt_is_at_stake() -> None:
    gangs = (
        running("never-saved", ("a1", (0,)), priority=1, started_at=at(NOW - 300)),
        running("saved-long-ago", ("a2", (0,)), priority=1, started_at=at(0), checkpointed_at=at(NOW - 400)),
    )
    decisions = decide(full("a1", "a2"), [VIP], POLICY, gangs=gangs, now=NOW)
    assert preempted(decisions) == {"never-saved"}


def test_two_small_gangs_that_lose_less_than_one_wide_one() -> None:
    """A 2-GPU job: two 1-GPU gangs losing 100 GPU-s each beat one 2-GPU gang losing 2 x 200."""
    gangs = (
        running("wide", ("a1", (0, 1)), priority=1, checkpointed_at=at(NOW - 140)),
        running("s1", ("a2", (0,)), priority=1, checkpointed_at=at(NOW - 40)),
        running("s2", ("a2", (1,)), priority=1, checkpointed_at=at(NOW - 40)),
    )
    nodes = [node("a1", gpus=2, free_gpus=()), node("a2", gpus=2, free_gpus=())]
    decisions = decide(nodes, [pending("vip", priority=9, gpu_count=2)], POLICY, gangs=gangs, now=NOW)
    assert preempted(decisions) == {"s1", "s2"}


def test_the_restart_cost_counts_per_gpu() -> None:
    """Two like losses since the checkpoint; the gang that takes longer to restart loses more."""
    gangs = (
        running(
            "slow-start", ("a1", (0,)), priority=1, started_at=at(10), checkpointed_at=at(NOW - 10), restart_s=600.0
        ),
        running("quick-start", ("a2", (0,)), priority=1, started_at=at(0), checkpointed_at=at(NOW - 10), restart_s=5.0),
    )
    decisions = decide(full("a1", "a2"), [VIP], POLICY, gangs=gangs, now=NOW)
    assert preempted(decisions) == {"quick-start"}


def test_equal_losses_go_to_the_lower_priority_then_the_newest() -> None:
    same = {"checkpointed_at": at(NOW - 50)}
    gangs = (
        running("p2", ("a1", (0,)), priority=2, started_at=at(10), **same),
        running("p1-old", ("a2", (0,)), priority=1, started_at=at(10), **same),
        running("p1-new", ("a3", (0,)), priority=1, started_at=at(20), **same),
    )
    decisions = decide(full("a1", "a2", "a3"), [VIP], POLICY, gangs=gangs, now=NOW)
    assert preempted(decisions) == {"p1-new"}


def test_a_higher_priority_gang_is_not_stopped_while_lower_ones_make_room() -> None:
    """It would only come back and preempt them in turn."""
    gangs = (
        running("p5", ("a1", (0,)), priority=5, checkpointed_at=at(NOW - 1)),
        running("p1", ("a2", (0,)), priority=1, checkpointed_at=at(NOW - 900)),
    )
    decisions = decide(full("a1", "a2"), [VIP], POLICY, gangs=gangs, now=NOW)
    assert preempted(decisions) == {"p1"}


def test_a_gang_the_job_does_not_outrank_is_never_taken_however_little_it_loses() -> None:
    gangs = (
        running("peer", ("a1", (0,)), priority=9, checkpointed_at=at(NOW - 1)),
        running("low", ("a2", (0,)), priority=1, checkpointed_at=at(NOW - 900)),
    )
    decisions = decide(full("a1", "a2"), [VIP], POLICY, gangs=gangs, now=NOW)
    assert preempted(decisions) == {"low"}


def test_the_order_rule_is_kept_for_comparison() -> None:
    gangs = (
        running("stale", ("a1", (0,)), priority=1, started_at=at(5), checkpointed_at=at(NOW - 900)),
        running("fresh", ("a2", (0,)), priority=1, started_at=at(0), checkpointed_at=at(NOW - 10)),
    )
    decisions = decide(full("a1", "a2"), [VIP], Policy(victims="order"), gangs=gangs, now=NOW)
    assert preempted(decisions) == {"stale"}  # the newest first, whatever it loses


def lost(gang: RunningJob) -> float:
    """The loss as the issue defines it, worked out here on its own."""
    since = gang.checkpointed_at or gang.started_at
    return gang.gpu_count * ((at(NOW) - since).total_seconds() + POLICY.restart_s)


def test_the_least_loss_matches_brute_force_on_random_small_clusters() -> None:
    """Random full clusters of 2-5 nodes of 1-4 GPUs, each GPU held by one of up to 8 gangs of random priorities
    and checkpoint ages (all in the first LAS queue); a job of a random size. The chosen set's loss equals the least
    over every subset that frees enough GPUs of the gangs it outranks up to the lowest priority that makes room (all
    nodes alike, so a set frees its GPUs)."""
    rng = random.Random(34)
    checked = 0
    for _case in range(300):
        sizes = [rng.randint(1, 4) for _ in range(rng.randint(2, 5))]
        nodes = [node(f"n{i}", gpus=g, free_gpus=()) for i, g in enumerate(sizes)]
        slots = [(f"n{i}", gpu) for i, g in enumerate(sizes) for gpu in range(g)]
        rng.shuffle(slots)
        gangs: list[RunningJob] = []
        while slots and len(gangs) < 8:
            take = slots[: rng.randint(1, min(3, len(slots)))]
            slots = slots[len(take) :]
            by_node: dict[str, list[int]] = {}
            for name, gpu in take:
                by_node.setdefault(name, []).append(gpu)
            started = rng.uniform(0, NOW - 700)
            saved = rng.choice([None, rng.uniform(started, NOW)])
            gangs.append(
                running(
                    f"g{len(gangs)}",
                    *((name, tuple(sorted(gpus))) for name, gpus in by_node.items()),
                    priority=rng.randint(0, 9),
                    started_at=at(started),
                    checkpointed_at=None if saved is None else at(saved),
                )
            )
        held = {(n, g) for gang in gangs for n, gpus in gang.shards for g in gpus}
        nodes = [
            node(f"n{i}", gpus=g, free_gpus=tuple(x for x in range(g) if (f"n{i}", x) not in held))
            for i, g in enumerate(sizes)
        ]
        free = sum(len(n.free_gpus) for n in nodes)
        vip_priority = rng.randint(1, 9)
        want = rng.randint(free + 1, sum(sizes))
        decisions = decide(
            nodes, [pending("vip", priority=vip_priority, gpu_count=want)], POLICY, gangs=tuple(gangs), now=NOW
        )
        best = None
        for tier in sorted({g.priority for g in gangs if g.priority < vip_priority}):
            allowed = [g for g in gangs if g.priority <= tier]
            best = min(
                (
                    sum(lost(g) for g in subset)
                    for size in range(1, len(allowed) + 1)
                    for subset in itertools.combinations(allowed, size)
                    if free + sum(g.gpu_count for g in subset) >= want
                ),
                default=None,
            )
            if best is not None:
                break
        chosen = preempted(decisions)
        if best is None:
            assert chosen == set()
            continue
        by_id = {g.job_id: g for g in gangs}
        assert free + sum(by_id[j].gpu_count for j in chosen) >= want
        assert abs(sum(lost(by_id[j]) for j in chosen) - best) < 1e-6, (sizes, gangs, want, chosen)
        checked += 1
    assert checked > 100
