"""The cycle's placement index: buckets by (load step, free GPUs) in load order, kept as placements and reservations
change them; the order a walk sees does not depend on how many nodes a bucket holds."""

from __future__ import annotations

from typing import Any

import pytest

from shardyard.events import NodeStatus
from shardyard.placement.index import ClusterIndex, Slot
from shardyard.placement.model import NodeView, Policy
from tests.unit.builders import GIB, job_spec
from tests.unit.placement_support import node as view

LOCAL = {"/data/models/gpt2": "shared", "/data/datasets/wikitext": "local"}


def node(node_id: str, model: str = "A100", gpus: int = 2, **overrides: Any) -> NodeView:
    """A node in load step 0 unless told otherwise."""
    return view(node_id, model, gpus, **{"cpu_load": 0.0, **overrides})


def index_of(*nodes: NodeView) -> ClusterIndex:
    return ClusterIndex(nodes, Policy())


def bucket_ids(index: ClusterIndex, step: int, free: int, model: str = "A100") -> list[str]:
    group = next(group for group in index.groups.values() if group.model == model)
    bucket = group.buckets.get((step, free))
    return [slot.node_id for slot in bucket.members()] if bucket else []


def take(index: ClusterIndex, node_id: str, gpus: int) -> None:
    slot = index.slots[node_id]
    index.take(slot, slot.free[:gpus], job_spec(gpu_count=1, memory_bytes=0, cpu_cores=0.0), coordinator=False)


@pytest.mark.parametrize(
    ("nodes", "step", "free", "expected"),
    [
        pytest.param(
            [node("a", cpu_load=0.05), node("b", cpu_load=0.01), node("c", cpu_load=0.09)],
            0,
            2,
            ["b", "a", "c"],
            id="least-load-first",
        ),
        pytest.param(
            [node("b", cpu_load=0.05), node("a", cpu_load=0.05)], 0, 2, ["a", "b"], id="equal-load-by-node-id"
        ),
        pytest.param(
            [node("a", cpu_load=0.05), node("b", cpu_load=0.15)], 1, 2, ["b"], id="load-step-of-0.1-per-bucket"
        ),
        pytest.param([node("a", gpus=8), node("b", gpus=4)], 0, 4, ["b"], id="free-gpus-per-bucket"),
        pytest.param([node("a", free_gpus=())], 0, 0, ["a"], id="no-free-gpu-still-filed"),
        pytest.param(
            [node("a", cpu_load=0.5), node("b", draining=True), node("c", cpu_load=0.2)],
            0,
            2,
            [],
            id="overloaded-and-draining-not-filed",
        ),
        pytest.param(
            [node("a", "NVIDIA A100-SXM4-80GB", cpu_load=0.02), node("b", "A100", cpu_load=0.01)],
            0,
            2,
            ["b", "a"],
            id="spellings-of-one-model-in-load-order",
        ),
    ],
)
def test_buckets_at_indexing(nodes: list[NodeView], step: int, free: int, expected: list[str]) -> None:
    assert bucket_ids(index_of(*nodes), step, free) == expected


@pytest.mark.parametrize(
    ("taken", "expected"),
    [
        pytest.param([], {4: ["a", "b", "c", "d"]}, id="untouched"),
        pytest.param([("a", 1)], {4: ["b", "c", "d"], 3: ["a"]}, id="front-leaves"),
        pytest.param([("c", 1)], {4: ["a", "b", "d"], 3: ["c"]}, id="middle-leaves"),
        pytest.param([("d", 2), ("b", 2)], {4: ["a", "c"], 2: ["b", "d"]}, id="arrivals-in-load-order"),
        pytest.param([("b", 1), ("b", 1)], {4: ["a", "c", "d"], 3: [], 2: ["b"]}, id="an-arrival-moves-on"),
        pytest.param([("a", 4), ("b", 4), ("c", 4)], {4: ["d"], 0: ["a", "b", "c"]}, id="full-nodes-stay-filed"),
        pytest.param([("a", 0)], {4: ["a", "b", "c", "d"]}, id="no-gpu-taken-keeps-its-place"),
    ],
)
def test_take_moves_a_node_to_the_bucket_of_its_new_free_count(
    taken: list[tuple[str, int]], expected: dict[int, list[str]]
) -> None:
    index = index_of(*(node(name, gpus=4, cpu_load=0.01 * i) for i, name in enumerate("abcd")))
    for node_id, gpus in taken:
        take(index, node_id, gpus)

    assert {free: bucket_ids(index, 0, free) for free in expected} == expected
    group = index.groups[("A100", 35.0)]
    assert group.free_gpus == 16 - sum(gpus for _, gpus in taken)
    assert group.nodes_total() == 4


def test_arrivals_merge_with_the_indexed_nodes_in_load_order() -> None:
    index = index_of(*(node(name, gpus=4 if name in "bd" else 3, cpu_load=0.01 * i) for i, name in enumerate("abcd")))
    take(index, "d", 1)
    take(index, "b", 1)

    assert bucket_ids(index, 0, 3) == ["a", "b", "c", "d"]


def test_gone_nodes_at_the_front_are_stepped_over_once() -> None:
    index = index_of(*(node(f"n{i}", gpus=2, cpu_load=0.001 * i) for i in range(6)))
    for i in range(3):
        take(index, f"n{i}", 1)
    bucket = index.groups[("A100", 35.0)].buckets[(0, 2)]

    assert [slot.node_id for slot in bucket.members()] == ["n3", "n4", "n5"]
    assert bucket.start == 3
    assert bucket.count == 3


def test_reserve_takes_a_node_out_of_the_walk() -> None:
    index = index_of(node("a"), node("b"))
    index.reserve(index.slots["a"], "job-9")
    index.reserve(index.slots["a"], "job-10")  # the first reservation holds

    assert bucket_ids(index, 0, 2) == ["b"]
    group = index.groups[("A100", 35.0)]
    assert (group.reserved, group.reserved_free, group.free_gpus, group.nodes_total()) == (1, 2, 2, 2)
    assert index.slots["a"].reserved_for == "job-9"
    assert not index.usable(index.slots["a"])


def test_memory_and_cpu_follow_the_taken_shards() -> None:
    index = index_of(node("a", gpus=4))
    slot = index.slots["a"]
    spec = job_spec(gpu_count=2, memory_bytes=64 * GIB, cpu_cores=8.0)
    index.take(slot, [0, 1], spec, coordinator=True)

    assert (slot.free, slot.memory, slot.cpu, slot.ports) == ([2, 3], 192 * GIB, 24.0, [29501])


def test_order_ranks_load_then_node_id_across_models() -> None:
    index = index_of(node("v", "V100", cpu_load=0.1), node("a", cpu_load=0.3), node("h", "H100", cpu_load=0.1))

    assert sorted(index.slots, key=lambda node_id: index.slots[node_id].order) == ["h", "v", "a"]


def test_local_nodes_are_slots_in_load_order_per_group_and_step() -> None:
    index = index_of(
        node("a", cpu_load=0.05, artifacts=LOCAL),
        node("b", cpu_load=0.01, artifacts=LOCAL),
        node("c", cpu_load=0.15, artifacts=LOCAL),
        node("d", cpu_load=0.02),
    )
    group = index.groups[("A100", 35.0)]
    local: list[Slot] = index.local_nodes("/data/datasets/wikitext", group, 0)

    assert [slot.node_id for slot in local] == ["b", "a"]
    assert [slot.node_id for slot in index.local_nodes("/data/datasets/wikitext", group, 1)] == ["c"]
    assert index.local_nodes("/data/models/gpt2", group, 0) == []


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        pytest.param([node("a", artifacts=LOCAL)], ["a"], id="usable-with-free-gpus"),
        pytest.param([node("a", artifacts=LOCAL, free_gpus=())], [], id="full"),
        pytest.param([node("a", artifacts=LOCAL, draining=True)], [], id="draining"),
        pytest.param([node("a", artifacts=LOCAL, status=NodeStatus.SUSPECT)], [], id="not-alive"),
        pytest.param(
            [node("a", artifacts={**LOCAL, "/data/datasets/./wikitext": "local"})], ["a"], id="listed-once-per-path"
        ),
    ],
)
def test_only_nodes_that_can_take_a_shard_are_listed_as_local(nodes: list[NodeView], expected: list[str]) -> None:
    index = index_of(*nodes)
    group = index.groups[("A100", 35.0)]

    assert [slot.node_id for slot in index.local_nodes("/data/datasets/wikitext", group, 0)] == expected


def test_a_node_leaves_the_local_lists_when_it_fills_up_or_is_reserved() -> None:
    index = index_of(*(node(name, artifacts=LOCAL, cpu_load=0.01 * i) for i, name in enumerate("abc")))
    group = index.groups[("A100", 35.0)]
    take(index, "a", 1)
    listed = [slot.node_id for slot in index.local_nodes("/data/datasets/wikitext", group, 0)]
    take(index, "a", 1)
    index.reserve(index.slots["c"], "job-9")

    assert listed == ["a", "b", "c"]
    assert [slot.node_id for slot in index.local_nodes("/data/datasets/wikitext", group, 0)] == ["b"]
