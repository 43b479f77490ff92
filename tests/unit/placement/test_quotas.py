"""Queues in the placement cycle (``placement.quota``): quota per GPU model, borrowing idle quota of the cohort,
fair share between queues, and reclaim of borrowed GPUs; and the queues file itself (``shardyard.quotas``)."""

import random
from collections import Counter
from copy import deepcopy
from dataclasses import replace
from typing import Any

import pytest

from shardyard.events import PendingReason
from shardyard.placement.cycle import schedule
from shardyard.placement.model import Decision, NodeView, PendingJob, Place, Preempt, RunningJob, Snapshot
from shardyard.quotas import Ledger, QueuesFileError, dominant_share, parse_queues
from tests.unit.builders import GIB, at
from tests.unit.placement_support import blocked, node, pending, running

TWO_TEAMS = """
min_runtime_s: 300
queues:
  a: {cohort: lab, weight: 1, gpus: {A100: 4}}
  b: {cohort: lab, weight: 1, gpus: {A100: 4}}
"""


def cluster(count: int = 4, model: str = "A100", *, busy: bool = False) -> list[NodeView]:
    """``count`` nodes of two GPUs each: free, or all held by gangs (``busy``)."""
    return [node(f"{model.lower()}-{i}", model, **({"free_gpus": ()} if busy else {})) for i in range(count)]


def jobs(queue: str, count: int, *, gpus: int = 2, priority: int = 0, **spec: Any) -> list[PendingJob]:
    return [
        pending(f"{queue}-{i}", queue=queue, gpu_count=gpus, priority=priority, ready=float(i), **spec)
        for i in range(count)
    ]


def cycle(
    config: str, nodes: list[NodeView], queued: list[PendingJob], gangs: tuple[RunningJob, ...] = (), now: float = 1.0
) -> list[Decision]:
    return schedule(Snapshot(tuple(nodes), gangs, quotas=parse_queues(config)), queued, now=at(now))


def gpus_placed(decisions: list[Decision]) -> Counter[str]:
    """Queue (the job id's prefix) -> GPUs placed."""
    placed: Counter[str] = Counter()
    for d in decisions:
        if isinstance(d, Place):
            placed[d.job_id.split("-")[0]] += sum(len(p.gpu_indices) for p in d.placements)
    return placed


def test_two_queues_with_equal_weights_each_get_half_of_a_contended_model() -> None:
    # Neither quota binds (each may use the whole cluster): fair share alone splits it.
    config = "queues:\n  a: {gpus: {A100: 8}}\n  b: {gpus: {A100: 8}}\n"
    decisions = cycle(config, cluster(4), [*jobs("a", 6), *jobs("b", 6)])

    assert gpus_placed(decisions) == {"a": 4, "b": 4}


def test_weights_split_a_contended_model_in_their_ratio() -> None:
    config = "queues:\n  a: {weight: 3, gpus: {A100: 8}}\n  b: {weight: 1, gpus: {A100: 8}}\n"
    decisions = cycle(config, cluster(4), [*jobs("a", 6), *jobs("b", 6)])

    assert gpus_placed(decisions) == {"a": 6, "b": 2}


def test_without_a_queues_file_one_queue_takes_what_it_outranks_as_before() -> None:
    queued = [*jobs("a", 6, priority=1), *jobs("b", 6)]
    decisions = schedule(Snapshot(tuple(cluster(4))), queued, now=at(1))

    assert gpus_placed(decisions) == {"a": 8}


def test_an_idle_queues_quota_is_borrowed_within_its_cohort() -> None:
    decisions = cycle(TWO_TEAMS, cluster(4), jobs("a", 4))

    assert gpus_placed(decisions) == {"a": 8}


def test_a_lenders_waiting_job_keeps_its_quota_from_being_borrowed() -> None:
    # a's gang of 8 would borrow all of b's idle 4; b's own job (within its nominal) goes first, and the 2 GPUs b
    # does not use now are all a could borrow: not enough.
    queued = [pending("a-big", queue="a", gpu_count=8), *jobs("b", 1)]
    decisions = cycle(TWO_TEAMS, cluster(4), queued)

    assert gpus_placed(decisions) == {"b": 2}
    assert blocked(next(d for d in decisions if d.job_id == "a-big")).reason is PendingReason.QUOTA_EXCEEDED


def test_a_lenders_job_waiting_on_capacity_claims_its_quota() -> None:
    # b's gang wants more memory a shard than any node has, and waits: its 4 are not idle, a borrows none of them.
    wide = pending("b-wide", queue="b", gpu_count=4, memory_bytes=4096 * GIB)
    queued = [pending("a-big", queue="a", gpu_count=6), wide]
    decisions = cycle(TWO_TEAMS, cluster(4), queued)

    assert not gpus_placed(decisions)
    assert blocked(next(d for d in decisions if d.job_id == "a-big")).reason is PendingReason.QUOTA_EXCEEDED


def test_a_lend_limit_caps_what_the_cohort_borrows() -> None:
    config = TWO_TEAMS.replace("b: {cohort: lab, weight: 1,", "b: {cohort: lab, lend: {A100: 2},")
    decisions = cycle(config, cluster(4), jobs("a", 4))

    assert gpus_placed(decisions) == {"a": 6}


def test_a_queue_without_a_cohort_waits_at_its_quota_naming_the_queue_and_the_model() -> None:
    config = "queues:\n  a: {gpus: {A100: 4}}\n  b: {gpus: {A100: 4}}\n"
    decisions = cycle(config, cluster(4), jobs("a", 3))

    assert gpus_placed(decisions) == {"a": 4}
    verdict = blocked(decisions[-1])
    assert verdict.reason is PendingReason.QUOTA_EXCEEDED
    assert "queue a" in verdict.message and "A100: holds 4 of nominal 4" in verdict.message


def test_quota_is_per_model() -> None:
    config = "queues:\n  a: {gpus: {A100: 2, V100: 4}}\n"
    nodes = [*cluster(2), *cluster(2, "V100")]
    queued = [
        *jobs("a", 2),
        pending("a-v", queue="a", gpu_model="V100", min_tflops=15.0, ready=5.0),
    ]
    decisions = cycle(config, nodes, queued)

    placed = {d.job_id for d in decisions if isinstance(d, Place)}
    assert placed == {"a-0", "a-v"}
    assert blocked(next(d for d in decisions if d.job_id == "a-1")).reason is PendingReason.QUOTA_EXCEEDED


def borrowed_by_a(started: float = 0.0, priorities: tuple[int, ...] = (0, 0, 0, 0)) -> tuple[RunningJob, ...]:
    """Queue a holding all 8 GPUs (4 borrowed from b): one 2-GPU gang per node, started ``started`` + i."""
    return tuple(
        running(
            f"a-run-{i}",
            (f"a100-{i}", (0, 1)),
            priority=priority,
            queue="a",
            started_at=at(started + i),
        )
        for i, priority in enumerate(priorities)
    )


def test_a_borrowed_gang_is_reclaimed_when_the_lender_submits_most_recent_first() -> None:
    decisions = cycle(TWO_TEAMS, cluster(4, busy=True), jobs("b", 1), borrowed_by_a(), now=1000.0)

    assert [d.job_id for d in decisions if isinstance(d, Preempt)] == ["a-run-3"]
    assert blocked(decisions[-1]).reason is PendingReason.PREEMPTING


def test_reclaim_takes_the_lowest_priority_borrower_first() -> None:
    decisions = cycle(
        TWO_TEAMS, cluster(4, busy=True), jobs("b", 1), borrowed_by_a(priorities=(0, 5, 0, 5)), now=1000.0
    )

    assert [d.job_id for d in decisions if isinstance(d, Preempt)] == ["a-run-2"]


def test_reclaim_takes_the_borrower_that_loses_least() -> None:
    """Victims by lost work among the borrowers: a-run-1 checkpointed 5 s ago; the newest (a-run-3) 900 s ago."""
    gangs = tuple(
        replace(gang, checkpointed_at=at(995.0 if gang.job_id == "a-run-1" else 100.0)) for gang in borrowed_by_a()
    )
    decisions = cycle(TWO_TEAMS, cluster(4, busy=True), jobs("b", 1), gangs, now=1000.0)

    assert [d.job_id for d in decisions if isinstance(d, Preempt)] == ["a-run-1"]


def test_reclaim_takes_no_more_than_the_borrower_borrows() -> None:
    # b wants its whole nominal (4) back: two gangs, a keeps its own 4.
    decisions = cycle(TWO_TEAMS, cluster(4, busy=True), jobs("b", 2), borrowed_by_a(), now=1000.0)

    assert sorted(d.job_id for d in decisions if isinstance(d, Preempt)) == ["a-run-2", "a-run-3"]


def test_a_gang_is_not_reclaimed_before_its_guaranteed_runtime() -> None:
    decisions = cycle(TWO_TEAMS, cluster(4, busy=True), jobs("b", 1), borrowed_by_a(started=900.0), now=1000.0)

    assert not [d for d in decisions if isinstance(d, Preempt)]
    assert blocked(decisions[-1]).reason is PendingReason.INSUFFICIENT_GPUS


def test_nothing_is_reclaimed_to_give_a_queue_more_than_its_nominal() -> None:
    # b asks for 6 GPUs, above its nominal 4: it would be borrowing, and a lends nothing while it uses its own.
    decisions = cycle(TWO_TEAMS, cluster(4, busy=True), jobs("b", 1, gpus=6), borrowed_by_a(), now=1000.0)

    assert not [d for d in decisions if isinstance(d, Preempt)]
    assert blocked(decisions[-1]).reason is PendingReason.QUOTA_EXCEEDED


def test_priority_preemption_stays_within_a_queue() -> None:
    # a holds only its nominal 4 (on two nodes), b its nominal 4: b's urgent job preempts none of a's.
    config = "queues:\n  a: {gpus: {A100: 8}}\n  b: {gpus: {A100: 8}}\n"
    gangs = borrowed_by_a()[:2] + tuple(
        running(f"b-run-{i}", (f"a100-{i}", (0, 1)), queue="b", started_at=at(0)) for i in (2, 3)
    )
    urgent = pending("b-urgent", queue="b", priority=10)
    decisions = cycle(config, cluster(4, busy=True), [urgent], gangs, now=1000.0)

    assert [d.job_id for d in decisions if isinstance(d, Preempt)] in (["b-run-2"], ["b-run-3"])


def own_and_bs(started: float = 0.0) -> tuple[RunningJob, ...]:
    """a's nominal 4 held by two gangs of a (nodes 0 and 1), b's by two of b (nodes 2 and 3), started at ``started``."""
    return tuple(
        running(f"{q}-run-{i}", (f"a100-{i}", (0, 1)), queue=q, started_at=at(started))
        for q, i in (("a", 0), ("a", 1), ("b", 2), ("b", 3))
    )


TWO_OF_FOUR = "queues:\n  a: {cohort: lab, gpus: {A100: 4}}\n  b: {cohort: lab, gpus: {A100: 4}}\n"


def test_a_job_its_queue_has_no_headroom_for_preempts_the_queues_gangs_it_outranks() -> None:
    # a's urgent 4-GPU job: a holds its whole nominal. It preempts a's two gangs for the room, none of b's.
    urgent = pending("a-urgent", queue="a", gpu_count=4, priority=10)
    decisions = cycle(TWO_OF_FOUR, cluster(4, busy=True), [urgent], own_and_bs(), now=1000.0)

    assert sorted(d.job_id for d in decisions if isinstance(d, Preempt)) == ["a-run-0", "a-run-1"]
    assert blocked(decisions[-1]).reason is PendingReason.PREEMPTING


def test_a_job_whose_queues_gangs_are_stopping_for_it_preempts_no_more() -> None:
    # The next cycle: a's gangs are checkpointing for a-urgent and still hold the quota. It waits on them.
    gangs = tuple(replace(g, preempted_by="a-urgent") if g.queue == "a" else g for g in own_and_bs())
    urgent = pending("a-urgent", queue="a", gpu_count=4, priority=10)
    decisions = cycle(TWO_OF_FOUR, cluster(4, busy=True), [urgent], gangs, now=1001.0)

    assert not [d for d in decisions if isinstance(d, Preempt)]
    assert blocked(decisions[-1]).reason is PendingReason.PREEMPTING


def test_a_job_short_of_headroom_preempts_no_more_of_its_queue_than_the_room_needs() -> None:
    # a holds 4 of nominal 6 (b lends none, using its own): a 4-GPU job needs 2 of them back, one gang.
    config = TWO_OF_FOUR.replace("a: {cohort: lab, gpus: {A100: 4}}", "a: {cohort: lab, gpus: {A100: 6}}")
    urgent = pending("a-urgent", queue="a", gpu_count=4, priority=10)
    nodes = [*cluster(4, busy=True), node("a100-4", "A100")]
    decisions = cycle(config, nodes, [urgent], own_and_bs(), now=1000.0)

    assert len([d for d in decisions if isinstance(d, Preempt)]) == 1
    assert {d.job_id for d in decisions if isinstance(d, Preempt)} <= {"a-run-0", "a-run-1"}


def test_a_wide_job_is_not_starved_by_its_own_queues_small_ones() -> None:
    # Under LAS a new job outranks its queue's gangs that have run past the minimum run time: the wide job gets
    # its queue's room instead of waiting for GPUs its queue's next small jobs would take as each ends.
    wide = pending("a-wide", queue="a", gpu_count=4, ready=999.0)
    decisions = cycle(TWO_OF_FOUR, cluster(4, busy=True), [wide], own_and_bs(), now=100_000.0)

    assert sorted(d.job_id for d in decisions if isinstance(d, Preempt)) == ["a-run-0", "a-run-1"]


def test_a_job_that_outranks_none_of_its_queues_gangs_waits_on_quota() -> None:
    # The same wide job, with a's gangs just started (within the minimum run time): it preempts nothing.
    wide = pending("a-wide", queue="a", gpu_count=4, ready=999.0)
    decisions = cycle(TWO_OF_FOUR, cluster(4, busy=True), [wide], own_and_bs(started=999.0), now=1000.0)

    assert not [d for d in decisions if isinstance(d, Preempt)]
    verdict = blocked(decisions[-1])
    assert verdict.reason is PendingReason.QUOTA_EXCEEDED and "queue a" in verdict.message


def test_a_job_of_an_unknown_queue_waits_on_quota() -> None:
    decisions = cycle(TWO_TEAMS, cluster(4), jobs("c", 1))

    verdict = blocked(decisions[-1])
    assert verdict.reason is PendingReason.QUOTA_EXCEEDED and "not in the queues file" in verdict.message


def test_a_cpu_quota_holds_a_job_back() -> None:
    config = "queues:\n  a: {gpus: {A100: 8}, cpu: 10}\n"
    decisions = cycle(config, cluster(4), jobs("a", 2))  # 8 cores each

    assert gpus_placed(decisions) == {"a": 2}
    assert "cpu: 8 of 10 cores" in blocked(decisions[-1]).message


def test_the_share_weights_each_gpu_by_its_models_tflops() -> None:
    config = parse_queues("queues:\n  a: {gpus: {H100: 4}}\n  b: {gpus: {V100: 4}}\n")
    ledger = Ledger(config)
    ledger.add("a", "H100", 2)
    ledger.add("b", "V100", 2)
    capacity, tflops = {"H100": 4, "V100": 4}, {"H100": 67.0, "V100": 15.0}

    assert dominant_share(ledger, "a", capacity, tflops) == pytest.approx(134 / 328)
    assert dominant_share(ledger, "b", capacity, tflops) == pytest.approx(30 / 328)


def test_a_job_larger_than_nominal_plus_borrowable_could_never_fit() -> None:
    config = parse_queues(TWO_TEAMS + "  c: {gpus: {A100: 2}}\n")

    assert config.ever("a", "A100") == 8
    assert config.ever("c", "A100") == 2  # no cohort: nothing to borrow
    assert config.ever("a", "V100") == 0


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("queues:\n  a:\n    gpus: {A100: -1}\n", 3, "a GPU count is a whole number >= 0"),
        ("queues:\n  a:\n    wieght: 2\n", 3, "Extra inputs are not permitted"),
        ("queues:\n  a: {gpus: {A100: 4}\n", 3, "not YAML"),
        ("queues: {}\n", 1, "at least 1 item"),
        ("min_runtime_s: -5\nqueues:\n  a: {}\n", 1, "greater than or equal to 0"),
        ("- a\n- b\n", 1, "a mapping with a 'queues' key"),
    ],
)
def test_a_bad_queues_file_is_refused_with_its_line_and_reason(text: str, line: int, reason: str) -> None:
    with pytest.raises(QueuesFileError) as refused:
        parse_queues(text)

    assert refused.value.line == line
    assert reason in refused.value.reason


def test_the_ledgers_kept_cohort_totals_match_a_fresh_count() -> None:
    config = parse_queues(
        "queues:\n"
        + "".join(f"  q{i}: {{cohort: lab, gpus: {{A100: {i}}}, lend: {{A100: {i // 2}}}}}\n" for i in range(6))
        + "  solo: {gpus: {A100: 3}}\n"
    )
    kept = Ledger(config)
    rng = random.Random(7)
    for _ in range(300):
        queue, gpus = rng.choice([*config.queues]), rng.randint(0, 3)
        (kept.add if rng.random() < 0.7 else kept.claim)(queue, "A100", gpus)
        fresh = Ledger(config, used={q: dict(m) for q, m in kept.used.items()}, claimed=deepcopy(kept.claimed))
        assert [kept.headroom(q, "A100") for q in config.queues] == [fresh.headroom(q, "A100") for q in config.queues]
