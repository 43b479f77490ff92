"""Elastic jobs in the placement core: a job that does not fit at its preferred size starts at the largest size from
its minimum up that fits now, with each shard's memory and CPU as the spec's; below its minimum it waits, preempts
or reserves as a rigid job does."""

from shardyard.events.job import Elasticity
from shardyard.events.reasons import PendingReason
from shardyard.placement.model import Place, Preempt
from tests.unit.placement_support import GIB, blocked, decide, node, only, pending, placed_on, running


def elastic(job_id: str = "job-1", *, shards: int = 4, low: int = 2, high: int = 8, **spec: object) -> object:
    return pending(job_id, gpu_count=shards, elasticity=Elasticity(min_shards=low, max_shards=high), **spec)


def test_an_elastic_job_that_fits_at_its_preferred_size_starts_at_it() -> None:
    assert len(placed_on(only([node("a", gpus=8)], elastic(shards=4)))) == 4


def test_an_elastic_job_starts_at_the_largest_size_that_fits_now() -> None:
    decision = only([node("a", gpus=2), node("b", gpus=1)], elastic(shards=4, low=2))

    assert sorted(placed_on(decision)) == ["a", "a", "b"]
    assert [p.shard_index for p in decision.placements] == [0, 1, 2]  # type: ignore[union-attr]


def test_a_rigid_job_of_that_size_waits() -> None:
    decision = only([node("a", gpus=2), node("b", gpus=2, free_gpus=(0,))], pending(gpu_count=4))

    assert blocked(decision).reason is PendingReason.INSUFFICIENT_GPUS


def test_below_its_minimum_an_elastic_job_waits_as_a_rigid_one_does() -> None:
    decision = only([node("a", gpus=4, free_gpus=(0,))], elastic(shards=4, low=2))

    assert blocked(decision).reason is PendingReason.INSUFFICIENT_GPUS


def test_an_elastic_job_larger_than_the_cluster_waits_for_its_minimum_not_forever() -> None:
    """Its preferred 16 GPUs never fit 4, but its minimum of 2 does once the gang there ends (or is preempted)."""
    gang = running("other", ("a", (0, 1, 2)), priority=9, preemptible=False)
    nodes = [node("a", gpus=4, free_gpus=(3,))]

    decision = blocked(decide(nodes, [elastic(shards=16, low=2, high=16)], gangs=(gang,))[-1])

    assert decision.reason is not PendingReason.NEVER_FITS
    assert len(placed_on(only([node("a", gpus=4)], elastic(shards=16, low=2, high=16)))) == 4


def test_each_shard_keeps_its_memory_so_a_smaller_gang_fits_what_memory_allows() -> None:
    """64 GiB over 4 shards: 16 GiB a shard; a node of 8 free GPUs and 40 GiB takes two of them."""
    tight = node("a", gpus=8, free_memory_bytes=40 * GIB)
    decision = only([tight], elastic(shards=4, low=1, memory_bytes=64 * GIB))

    assert placed_on(decision) == ["a", "a"]


def test_an_elastic_job_that_can_start_at_its_minimum_preempts_nobody() -> None:
    gang = running("low", ("a", (0, 1, 2, 3, 4, 5)), priority=0)
    nodes = [node("a", gpus=8, free_gpus=(6, 7))]

    decisions = decide(nodes, [elastic(shards=4, low=2, priority=5)], gangs=(gang,))

    assert not any(isinstance(d, Preempt) for d in decisions)
    assert [type(d) for d in decisions] == [Place]
    assert placed_on(decisions[0]) == ["a", "a"]


def test_below_its_minimum_it_preempts_for_its_preferred_size_as_a_rigid_job_does() -> None:
    gang = running("low", ("a", (0, 1, 2, 3, 4, 5, 6)), priority=0)
    nodes = [node("a", gpus=8, free_gpus=(7,))]

    decisions = decide(nodes, [elastic(shards=4, low=2, priority=5)], gangs=(gang,))

    assert [d.job_id for d in decisions if isinstance(d, Preempt)] == ["low"]
