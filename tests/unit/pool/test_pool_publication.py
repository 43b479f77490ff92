"""The pool publishes a node's state when it changes, not per heartbeat; its silence check reads only the nodes that
are near suspicion."""

from typing import Any

import pytest

from shardyard.bus.topics import HEARTBEATS, partition_of
from shardyard.events import DiskSpace, GpuStatus, NodeLease, NodeState, NodeStatus, RunningShard
from shardyard.resource_pool.book import PoolBook
from shardyard.resource_pool.telemetry import Tolerance
from tests.unit.builders import GIB, at, gpus, heartbeat, node_state, relayed


def published(book: PoolBook, seconds: float, **overrides: Any) -> list[str]:
    """The statuses of what one heartbeat of node-a, ``seconds`` after T0, publishes."""
    beat = heartbeat("node-a", seq=int(seconds * 10), occurred_at=at(seconds), **overrides)
    return [e.status for e in book.on_heartbeat(beat, at(seconds)) if isinstance(e, NodeState)]


def a_book(**fields: Any) -> PoolBook:
    book = PoolBook(**fields)
    assert published(book, 0) == [NodeStatus.ALIVE]
    return book


def hot_gpus(**fields: Any) -> tuple[GpuStatus, ...]:
    first, second = gpus()
    return (first.model_copy(update=fields), second)


@pytest.mark.parametrize(
    ("overrides", "publishes"),
    [
        pytest.param({}, False, id="same-heartbeat"),
        pytest.param({"cpu_load": 0.14}, False, id="load-within-step"),
        pytest.param({"cpu_load": 0.15}, True, id="load-by-a-step"),
        pytest.param({"gpus": hot_gpus(utilization=0.05)}, False, id="gpu-use-within-step"),
        pytest.param({"gpus": hot_gpus(utilization=0.5)}, True, id="gpu-use-by-a-step"),
        pytest.param({"gpus": hot_gpus(memory_used_bytes=2 * GIB)}, False, id="gpu-memory-within-step"),
        pytest.param({"gpus": hot_gpus(memory_used_bytes=40 * GIB)}, True, id="gpu-memory-by-a-step"),
        pytest.param({"gpus": hot_gpus(temperature_c=60.0)}, True, id="temperature-appears"),
        pytest.param({"gpus": hot_gpus(healthy=False, fault="Xid 79")}, True, id="gpu-fault"),
        pytest.param({"gpus": gpus(count=3)}, True, id="gpu-added"),
        pytest.param({"artifacts": {}}, True, id="artifacts"),
        pytest.param({"topology": {"zone": "z2"}}, True, id="topology"),
        pytest.param({"running": (RunningShard(job_id="j", shard_index=0, attempt=1),)}, True, id="running-shards"),
        pytest.param({"agent_instance": "node-a-agent-2"}, True, id="agent-restarted"),
        pytest.param({"address": "elsewhere"}, True, id="address"),
    ],
)
def test_a_heartbeat_publishes_the_nodes_state_only_when_it_changes(overrides: dict[str, Any], publishes: bool) -> None:
    book = a_book()

    assert published(book, 1, **overrides) == ([NodeStatus.ALIVE] if publishes else [])


def test_telemetry_is_compared_with_what_was_last_published_so_a_slow_drift_still_goes_out() -> None:
    book = a_book()

    drift = [published(book, 1 + i, cpu_load=0.1 + 0.02 * (i + 1)) for i in range(3)]

    assert drift == [[], [], [NodeStatus.ALIVE]]  # 0.12, 0.14, then 0.16: a step from the 0.10 published


def test_the_load_step_is_a_setting() -> None:
    book = a_book(tolerance=Tolerance(load=0.01))

    assert published(book, 1, cpu_load=0.11) == [NodeStatus.ALIVE]


def test_an_unchanged_node_is_republished_every_refresh() -> None:
    book = a_book(refresh_s=30.0)

    beats = {second: published(book, second) for second in range(1, 62)}

    assert [second for second, states in beats.items() if states] == [30, 60]


def test_a_suspected_node_that_heartbeats_again_is_published_alive_at_once() -> None:
    book = a_book(suspect_after_s=3.0)
    (suspect,) = book.tick(at(3.5))
    assert isinstance(suspect, NodeState) and suspect.status is NodeStatus.SUSPECT

    assert published(book, 4) == [NodeStatus.ALIVE]


def test_a_takeover_republishes_each_node_once() -> None:
    book = a_book()
    book.assign([0, 1, 2, 3], at(1))

    assert (published(book, 2), published(book, 3)) == ([NodeStatus.ALIVE], [])


def test_the_silence_check_stops_at_the_first_node_short_of_suspicion() -> None:
    book = PoolBook(suspect_after_s=3.0, lost_after_s=10.0)
    for n in range(1000):
        book.on_heartbeat(heartbeat(f"node-{n}", occurred_at=at(n / 1000)), at(n / 1000))
    book.on_heartbeat(heartbeat("node-0", seq=1, occurred_at=at(2)), at(2))  # the oldest heartbeats again

    assert list(book.watched)[:2] == ["node-1", "node-2"] and list(book.watched)[-1] == "node-0"
    suspected = [e.node_id for e in book.tick(at(3.45)) if isinstance(e, NodeState)]
    assert suspected == [f"node-{n}" for n in range(1, 451)]  # silent >= 3 s; node-0 spoke at 2 s


def test_nodes_restored_out_of_order_are_still_judged() -> None:
    book = PoolBook(suspect_after_s=3.0, lost_after_s=10.0)
    book.on_heartbeat(heartbeat("node-new", occurred_at=at(5)), at(5))
    book.restore(node_state("node-old", last_heartbeat_at=at(0)))  # known from the log, quiet since 0 s

    judged = {e.node_id: e.status for e in book.tick(at(4)) if isinstance(e, NodeState)}

    assert judged == {"node-old": NodeStatus.SUSPECT}


def test_a_lost_node_leaves_the_watch_and_returns_with_its_next_heartbeat() -> None:
    book = a_book(suspect_after_s=3.0, lost_after_s=10.0)
    book.tick(at(3))
    book.tick(at(10))
    assert "node-a" not in book.watched and book.nodes["node-a"].status is NodeStatus.LOST

    assert published(book, 11) == [NodeStatus.ALIVE]
    assert list(book.watched) == ["node-a"]


def lease(seconds: float, **overrides: Any) -> NodeLease:
    fields: dict[str, Any] = {
        "occurred_at": at(seconds),
        "node_id": "node-a",
        "agent_instance": "node-a-agent-1",
        "seq": int(seconds * 10),
        "cpu_load": 0.1,
        "gpu_utilization": (0.0, 0.0),
        "gpu_memory_used_bytes": (0, 0),
        "gpu_temperature_c": (None, None),
    }
    return NodeLease(**{**fields, **overrides})


def test_leases_keep_a_node_alive_and_publish_nothing_while_nothing_changes() -> None:
    book = a_book(suspect_after_s=3.0)

    renewals = [book.on_lease(lease(second), at(second)) for second in range(1, 10)]

    assert renewals == [[]] * 9
    assert book.tick(at(11.5)) == []  # silent 2.5 s since the last lease
    (suspect,) = book.tick(at(12.5))
    assert isinstance(suspect, NodeState) and suspect.status is NodeStatus.SUSPECT


def test_a_lease_whose_telemetry_moved_publishes_the_state_with_it() -> None:
    book = a_book()

    (state,) = book.on_lease(lease(1, cpu_load=0.4, gpu_utilization=(0.9, 0.0), gpu_temperature_c=(70.0, 40.0)), at(1))

    assert isinstance(state, NodeState)
    assert (state.cpu_load, [g.utilization for g in state.gpus]) == (0.4, [0.9, 0.0])
    assert [g.temperature_c for g in state.gpus] == [70.0, 40.0]
    assert [g.model for g in state.gpus] == ["A100", "A100"]  # the inventory is the last full heartbeat's


@pytest.mark.parametrize(
    "stranger",
    [
        pytest.param(lease(1, node_id="node-unknown"), id="unknown-node"),
        pytest.param(lease(1, agent_instance="node-a-agent-2"), id="restarted-agent-before-its-full-heartbeat"),
        pytest.param(lease(1, seq=4), id="older-than-the-last-heartbeat"),
    ],
)
def test_a_lease_the_pool_cannot_place_renews_nothing(stranger: NodeLease) -> None:
    book = a_book(suspect_after_s=3.0)
    book.on_heartbeat(heartbeat("node-a", seq=5, occurred_at=at(0.5)), at(0.5))

    assert book.on_lease(stranger, at(3)) == []
    suspected = [e.node_id for e in book.tick(at(3.6)) if isinstance(e, NodeState)]
    assert suspected == ["node-a"]


def test_a_lease_brings_a_suspected_node_back_at_once() -> None:
    book = a_book(suspect_after_s=3.0)
    book.tick(at(3.5))

    (state,) = book.on_lease(lease(4), at(4))

    assert isinstance(state, NodeState) and state.status is NodeStatus.ALIVE


def test_a_lease_with_figures_for_other_gpus_keeps_the_known_ones() -> None:
    book = a_book()

    (state,) = book.on_lease(lease(1, cpu_load=0.5, gpu_utilization=(1.0,), gpu_memory_used_bytes=(1,)), at(1))

    assert isinstance(state, NodeState)
    assert (state.cpu_load, [g.utilization for g in state.gpus]) == (0.5, [0.0, 0.0])


def output_disk(free: int) -> DiskSpace:
    return DiskSpace(path="/data/checkpoints", free_bytes=free, total_bytes=100 * GIB)


@pytest.mark.parametrize(
    ("free", "publishes"),
    [
        pytest.param(10 * GIB - 2**20, False, id="within-a-10pct-step"),
        pytest.param(8 * GIB, True, id="by-a-10pct-step"),
        pytest.param(0, True, id="full"),
    ],
)
def test_the_output_disk_publishes_the_state_by_10pct_steps_of_free_space(free: int, publishes: bool) -> None:
    book = a_book()
    assert published(book, 1, output_disk=output_disk(10 * GIB)) == [NodeStatus.ALIVE]  # reported at last

    states = book.on_heartbeat(heartbeat("node-a", seq=20, occurred_at=at(2), output_disk=output_disk(free)), at(2))

    assert [s.output_disk for s in states if isinstance(s, NodeState)] == ([output_disk(free)] if publishes else [])


def test_the_output_disk_comes_back_from_the_node_state_topic() -> None:
    book = PoolBook()
    book.restore(node_state("node-a", output_disk=output_disk(GIB)))

    assert book.state_of("node-a", at(1)).output_disk == output_disk(GIB)


def test_relayed_leases_keep_the_nodes_alive_as_their_own_leases_would() -> None:
    book = PoolBook(suspect_after_s=3.0)
    for node in ("node-a", "node-b"):
        book.on_heartbeat(heartbeat(node, occurred_at=at(0)), at(0))

    for second in range(1, 10):
        beats = [heartbeat(node, seq=second, occurred_at=at(second)) for node in ("node-a", "node-b")]
        assert book.on_leases(relayed("rack-1", *beats, occurred_at=at(second)), at(second)) == []

    assert book.tick(at(11.5)) == []
    assert sorted(e.node_id for e in book.tick(at(12.5)) if isinstance(e, NodeState)) == ["node-a", "node-b"]


def test_a_replica_applies_only_the_relayed_leases_of_the_nodes_it_owns() -> None:
    mine = "node-a"
    theirs = next(
        f"node-{i}" for i in range(100) if partition_of(f"node-{i}", HEARTBEATS) != partition_of(mine, HEARTBEATS)
    )
    book = PoolBook(suspect_after_s=3.0)
    book.assign(frozenset({partition_of(mine, HEARTBEATS)}), at(0))
    for node in (mine, theirs):
        book.on_heartbeat(heartbeat(node, occurred_at=at(0)), at(0))
    beats = [heartbeat(node, seq=1, occurred_at=at(1), cpu_load=0.9) for node in (mine, theirs)]

    changed = book.on_leases(relayed("rack-1", *beats, occurred_at=at(1)), at(1))

    assert [e.node_id for e in changed if isinstance(e, NodeState)] == [mine]
    assert book.nodes[theirs].seq == 0
