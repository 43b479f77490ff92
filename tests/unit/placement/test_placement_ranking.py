"""Ranking tie-breaks in order (match, load, locality, fragmentation, latency) and the coordinator choice."""

from __future__ import annotations

from tests.unit.builders import ARTIFACTS
from tests.unit.placement_support import node, only, pending, placed_on

LOCAL = {path: "local" for path in ARTIFACTS}
ONE_LOCAL = {**ARTIFACTS, "/data/datasets/wikitext": "local"}


def test_best_match_first() -> None:
    job = pending(gpu_model=None, min_tflops=35.0, min_match=0.4, gpu_count=1)

    assert placed_on(only([node("v1", "V100", cpu_load=0.0), node("a1", cpu_load=0.4)], job)) == ["a1"]


def test_least_load_next() -> None:
    assert placed_on(only([node("a1", cpu_load=0.35), node("a2", cpu_load=0.05)])) == ["a2", "a2"]


def test_loads_within_one_step_are_equal_so_locality_decides() -> None:
    nodes = [node("a1", cpu_load=0.01), node("a2", cpu_load=0.09, artifacts=LOCAL)]

    assert placed_on(only(nodes)) == ["a2", "a2"]


def test_locality_counts_each_local_artifact() -> None:
    nodes = [node("a1", artifacts=ONE_LOCAL), node("a2", artifacts=LOCAL), node("a3")]

    assert placed_on(only(nodes, pending(gpu_count=1))) == ["a2"]


def test_load_beats_locality() -> None:
    nodes = [node("a1", cpu_load=0.3, artifacts=LOCAL), node("a2", cpu_load=0.0)]

    assert placed_on(only(nodes)) == ["a2", "a2"]


def test_fragmentation_single_gpu_job_takes_the_partly_used_node() -> None:
    nodes = [node("whole", gpus=8), node("part", gpus=8, free_gpus=(7,))]

    assert placed_on(only(nodes, pending(gpu_count=1))) == ["part"]


def test_fragmentation_gang_prefers_one_node_that_fits_it_exactly() -> None:
    nodes = [node("big", gpus=8), node("fit", gpus=8, free_gpus=(4, 5, 6, 7)), node("one", gpus=1)]

    assert placed_on(only(nodes, pending(gpu_count=4))) == ["fit"] * 4


def test_fragmentation_fewest_nodes_for_a_wide_gang() -> None:
    nodes = [node(f"s{i}", gpus=1) for i in range(8)] + [node("w", gpus=8)]

    assert placed_on(only(nodes, pending(gpu_count=8))) == ["w"] * 8


def test_latency_keeps_a_gang_in_one_rack() -> None:
    nodes = [
        node("a1", gpus=1, zone="z1", rack="r1"),
        node("a2", gpus=1, zone="z2", rack="r9"),
        node("a3", gpus=1, zone="z1", rack="r2"),
        node("a4", gpus=1, zone="z1", rack="r1"),
    ]

    assert placed_on(only(nodes)) == ["a1", "a4"]


def test_measured_rtt_overrides_topology() -> None:
    nodes = [node("a1", gpus=1), node("a2", gpus=1), node("a3", gpus=1)]
    rtt = {("a1", "a2"): 3.0, ("a1", "a3"): 0.2, ("a2", "a3"): 0.4}

    assert placed_on(only(nodes, rtt=rtt)) == ["a1", "a3"]


def test_coordinator_is_the_member_with_lowest_mean_rtt() -> None:
    nodes = [node("a1", gpus=1), node("a2", gpus=1), node("a3", gpus=1)]
    rtt = {("a1", "a2"): 1.0, ("a1", "a3"): 1.0, ("a2", "a3"): 0.1}

    decision = only(nodes, pending(gpu_count=3), rtt=rtt)

    assert decision.coordinator_node in {"a2", "a3"}  # type: ignore[union-attr]
    assert decision.coordinator_node != "a1"  # type: ignore[union-attr]


def test_coordinator_needs_a_free_rendezvous_port() -> None:
    nodes = [node("a1", gpus=1, rendezvous_ports=()), node("a2", gpus=1)]

    assert only(nodes).coordinator_node == "a2"  # type: ignore[union-attr]


def test_no_port_anywhere_is_reported() -> None:
    decision = only([node("a1", rendezvous_ports=())])

    assert decision.node_counts == {"no free rendezvous port": 1}  # type: ignore[union-attr]


def test_shards_on_one_node_get_distinct_gpus_in_rank_order() -> None:
    decision = only([node("a1", gpus=4, free_gpus=(1, 3, 4))], pending(gpu_count=3))

    assert [p.gpu_indices for p in decision.placements] == [(1,), (3,), (4,)]  # type: ignore[union-attr]
    assert [p.shard_index for p in decision.placements] == [0, 1, 2]  # type: ignore[union-attr]


def test_a_degraded_node_ranks_last_for_every_gang() -> None:
    from shardyard.placement.cycle import schedule
    from shardyard.placement.model import Place, Snapshot
    from tests.unit.builders import at

    nodes = (node("a1", cpu_load=0.0), node("a2", cpu_load=0.3))

    def on(snapshot: Snapshot, gpus: int) -> list[str]:
        (decision,) = schedule(snapshot, [pending(gpu_count=gpus)], None, now=at(1))
        assert isinstance(decision, Place), decision
        return sorted({p.node_id for p in decision.placements})

    assert on(Snapshot(nodes), 2) == ["a1"]  # the least loaded takes the gang whole
    assert on(Snapshot(nodes, degraded=frozenset({"a1"})), 2) == ["a2"]  # even alone: unlike a slow link's node
    assert on(Snapshot(nodes, degraded=frozenset({"a1"})), 4) == ["a1", "a2"]  # used when nothing else fits
