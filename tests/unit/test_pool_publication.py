"""The pool publishes a node's state when it changes, not per heartbeat; its silence check reads only the nodes that
are near suspicion."""

from typing import Any

import pytest

from shardyard.events import GpuStatus, NodeState, NodeStatus, RunningShard
from shardyard.resource_pool.book import PoolBook, Tolerance
from tests.unit.builders import GIB, at, gpus, heartbeat, node_state


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
