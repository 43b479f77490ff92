"""Re-forming a recovering gang where it stands: which shards survive, spares promoted into the lost shards' places,
and the re-formed gang's numbering and coordinator. (Through the book, with placement of lost shards: see
``test_scheduler_recovery``.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shardyard.events import NodeState, NodeStatus, ShardPlacement
from shardyard.placement.model import NodeView, Policy, Snapshot
from shardyard.scheduler.gang import Gang
from shardyard.scheduler.reform import Ground, promote, reform, regroup, survivors
from tests.unit.builders import at, job_spec, node_state, placement, scheduled

NODES = ("n1", "n2", "n3", "s1", "s2")


def spare(shard_index: int, node_id: str) -> ShardPlacement:
    return placement(shard_index, node_id).model_copy(update={"spare": True})


def gang(*training: str, spares: tuple[str, ...] = ()) -> Gang:
    """One training shard on each of ``training``, then a spare on each of ``spares``."""
    shards = [placement(i, node) for i, node in enumerate(training)]
    shards += [spare(len(training) + i, node) for i, node in enumerate(spares)]
    spec = job_spec(gpu_count=len(training), memory_bytes=0, cpu_cores=1.0)
    return Gang(spec, scheduled("job-1", *training, placements=tuple(shards)))


def nodes(**status: NodeStatus) -> dict[str, NodeState]:
    return {n: node_state(n, status=status.get(n, NodeStatus.ALIVE)) for n in NODES}


def view(node_id: str, zone: str = "") -> NodeView:
    return NodeView(
        node_id=node_id,
        status=NodeStatus.ALIVE,
        address=f"{node_id}.cluster",
        gpu_model="A100",
        tflops=35.0,
        free_gpus=(0, 1),
        free_memory_bytes=0,
        free_cpu_cores=8.0,
        cpu_load=0.1,
        rendezvous_ports=(29500,),
        zone=zone,
    )


def ground(
    views: dict[str, NodeView] | None = None, free_port: Callable[[NodeView], int | None] | None = None
) -> Ground:
    return Ground(
        nodes=nodes(),
        before=Snapshot((), ()),
        views=views if views is not None else {n: view(n) for n in NODES},
        free_port=free_port or (lambda v: v.rendezvous_ports[0]),
        policy=Policy(),
    )


@pytest.mark.parametrize(
    ("excluded", "status", "kept", "kept_spares", "lost"),
    [
        pytest.param(frozenset(), {}, ["n1", "n2"], ["s1"], 0, id="all-usable"),
        pytest.param(frozenset({"n2"}), {}, ["n1"], ["s1"], 1, id="an-excluded-node-loses-its-shard"),
        pytest.param(frozenset(), {"n1": NodeStatus.SUSPECT}, ["n2"], ["s1"], 1, id="a-suspect-node-too"),
        pytest.param(frozenset(), {"s1": NodeStatus.LOST}, ["n1", "n2"], [], 0, id="a-spare-on-a-lost-node-goes"),
    ],
)
def test_the_survivors(
    excluded: frozenset[str], status: dict[str, NodeStatus], kept: list[str], kept_spares: list[str], lost: int
) -> None:
    found = survivors(gang("n1", "n2", spares=("s1",)), excluded, nodes(**status))

    assert [p.node_id for p in found.training] == kept
    assert [p.node_id for p in found.spares] == kept_spares
    assert found.lost == lost


def test_a_node_nobody_reported_does_not_keep_its_shard() -> None:
    found = survivors(gang("n1", "gone"), frozenset(), nodes())

    assert ([p.node_id for p in found.training], found.lost) == (["n1"], 1)


def test_spares_take_the_lost_shards_places_and_the_rest_stay_spares() -> None:
    failed = gang("n1", "n2", spares=("s1", "s2"))

    place = reform(failed, frozenset({"n2"}), ground(), at(5))

    assert place is not None
    assert [(p.shard_index, p.node_id, p.spare) for p in place.placements] == [
        (0, "n1", False),
        (1, "s1", False),
        (2, "s2", True),
    ]


@pytest.mark.parametrize(
    ("excluded", "spares"),
    [
        pytest.param(frozenset(), ("s1",), id="nothing-lost"),
        pytest.param(frozenset({"n1", "n2"}), ("s1",), id="fewer-spares-than-lost-shards"),
    ],
)
def test_no_promotion(excluded: frozenset[str], spares: tuple[str, ...]) -> None:
    failed = gang("n1", "n2", spares=spares)

    assert promote(failed, survivors(failed, excluded, nodes()), ground()) is None


def test_the_coordinator_is_the_member_closest_to_the_others_with_a_port_free() -> None:
    views = {"n1": view("n1", "a"), "n2": view("n2", "a"), "n3": view("n3", "b")}
    members = [placement(0, "n3"), placement(1, "n1"), placement(2, "n2")]
    failed = gang("n3", "n1", "n2")

    closest = regroup(failed, members, [], ground(views))
    without_n1 = regroup(failed, members, [], ground(views, lambda v: None if v.node_id == "n1" else 29500))
    no_port = regroup(failed, members, [], ground(views, lambda v: None))

    assert closest is not None and closest.coordinator_node == "n1"  # n3 is a zone away from both others
    assert without_n1 is not None and without_n1.coordinator_node == "n2"
    assert no_port is None


def test_a_member_whose_node_has_no_view_leaves_the_gang_unformed() -> None:
    failed = gang("n1", "n2")

    assert regroup(failed, [placement(0, "n1"), placement(1, "n2")], [], ground({"n1": view("n1")})) is None


def test_the_regrouped_gang_is_degraded_when_a_member_is() -> None:
    slow = placement(1, "n2").model_copy(update={"degraded": True})
    failed = gang("n1", "n2")

    place = regroup(failed, [placement(0, "n1"), slow], [spare(0, "s1")], ground())

    assert place is not None and place.degraded
    assert [(p.shard_index, p.spare) for p in place.placements] == [(0, False), (1, False), (2, True)]
