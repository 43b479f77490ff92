"""The autoscaler's policy, pure: bounds, cooldown, no flapping, pending capacity, idle removal, the min-nodes floor."""

from typing import Any

import pytest

from shardyard.autoscale.provider import ProvidedNode
from shardyard.autoscaler.book import (
    TRANSITIONS,
    Add,
    AutoscaleBook,
    AutoscalePolicy,
    Drain,
    Managed,
    Phase,
    Remove,
    RemoveReason,
    Undrain,
)
from shardyard.events import CapacityRequested, NodeStatus, ReclaimCandidate
from tests.unit.builders import T0, at, gpus, node_state


def book(**overrides: Any) -> AutoscaleBook:
    fields: dict[str, Any] = {
        "node_gpus": {"V100": 2, "A100": 1},
        "max_nodes": 3,
        "cooldown_s": 10.0,
        "min_lifetime_s": 30.0,
        "join_timeout_s": 60.0,
        "demand_ttl_s": 60.0,
        "drain_retry_s": 10.0,
        "tflops": {"V100": 15.0, "A100": 35.0},
    }
    return AutoscaleBook(AutoscalePolicy(**{**fields, **overrides}))


def capacity(model: str, count: int, seconds: float, *jobs: str, floor: float = 15.0) -> CapacityRequested:
    return CapacityRequested(
        occurred_at=at(seconds), gpu_model=model, min_tflops=floor, gpus=count, jobs=jobs or ("job-1",), waiting_s=1
    )


def reclaim(node_id: str, seconds: float) -> ReclaimCandidate:
    return ReclaimCandidate(occurred_at=at(seconds), node_id=node_id, gpu_model="V100", gpus=2, idle_s=5)


def state(node_id: str, seconds: float, *, status: NodeStatus = NodeStatus.ALIVE, **overrides: Any) -> Any:
    return node_state(node_id, occurred_at=at(seconds), status=status, gpus=gpus("V100", 2, 15.0), **overrides)


def alive_node(scaler: AutoscaleBook, node_id: str = "auto-v100-0", added: float = 0, up: float = 5) -> None:
    scaler.on_added([node_id], "V100", 2, at(added))
    scaler.on_node_state(state(node_id, up))


@pytest.mark.parametrize(
    ("model", "count", "floor", "expected"),
    [
        ("V100", 3, 15.0, [Add("V100", 2, 2, ("job-1",))]),
        ("V100", 2, 15.0, [Add("V100", 2, 1, ("job-1",))]),
        ("H100", 2, 15.0, []),
        ("ANY", 1, 20.0, [Add("A100", 1, 1, ("job-1",))]),
        ("ANY", 1, 10.0, [Add("V100", 2, 1, ("job-1",))]),
        ("ANY", 1, 50.0, []),
    ],
    ids=["whole-nodes", "one-node", "model-not-allowed", "any-with-floor", "any-first-allowed", "any-none-reaches"],
)
def test_a_capacity_request_adds_whole_nodes_of_an_allowed_model(
    model: str, count: int, floor: float, expected: list[Add]
) -> None:
    scaler = book()
    scaler.on_capacity(capacity(model, count, 0, floor=floor))
    assert scaler.decide(at(1)) == expected


def test_max_nodes_bounds_what_is_added() -> None:
    scaler = book(max_nodes=3)
    scaler.on_capacity(capacity("A100", 10, 0))
    assert scaler.decide(at(1)) == [Add("A100", 1, 3, ("job-1",))]
    scaler.on_added(["a", "b", "c"], "A100", 1, at(1))
    scaler.on_capacity(capacity("V100", 4, 20))
    assert scaler.decide(at(21)) == []


def test_a_repeated_request_adds_nothing_while_the_first_nodes_join() -> None:
    scaler = book()
    scaler.on_capacity(capacity("V100", 2, 0))
    assert scaler.decide(at(1)) == [Add("V100", 2, 1, ("job-1",))]
    scaler.on_added(["auto-v100-0"], "V100", 2, at(1))
    scaler.on_capacity(capacity("V100", 2, 30))  # the scheduler's repeat, past the cooldown
    assert scaler.decide(at(31)) == []
    scaler.on_capacity(capacity("V100", 4, 32, "job-1", "job-2"))  # more demand: only the part not joining
    assert scaler.decide(at(33)) == [Add("V100", 2, 1, ("job-1", "job-2"))]


def test_pending_capacity_ends_at_the_join_timeout_and_the_node_is_removed() -> None:
    scaler = book()
    scaler.on_added(["auto-v100-0"], "V100", 2, at(0))
    assert scaler.decide(at(60)) == []
    assert scaler.decide(at(61)) == [Remove("auto-v100-0", RemoveReason.JOIN_TIMEOUT)]
    assert scaler.decide(at(62)) == []  # being removed: not decided again
    scaler.on_removed("auto-v100-0")
    scaler.on_capacity(capacity("V100", 2, 63))
    assert scaler.decide(at(64)) == [Add("V100", 2, 1, ("job-1",))]


def test_scale_actions_keep_the_cooldown_between_them() -> None:
    scaler = book(cooldown_s=10.0)
    scaler.on_capacity(capacity("V100", 2, 0))
    assert scaler.decide(at(1)) == [Add("V100", 2, 1, ("job-1",))]
    scaler.on_added(["auto-v100-0"], "V100", 2, at(1))
    scaler.on_capacity(capacity("A100", 1, 2))
    assert scaler.decide(at(5)) == []
    assert scaler.decide(at(11)) == [Add("A100", 1, 1, ("job-1",))]


def test_a_request_from_before_its_models_last_node_came_alive_is_answered() -> None:
    scaler = book()
    scaler.on_capacity(capacity("V100", 2, 0))
    scaler.decide(at(0))
    alive_node(scaler, added=0, up=5)
    scaler.on_capacity(capacity("V100", 2, 4))  # published before the node came up: it is the one answering it
    assert scaler.decide(at(20)) == []
    assert scaler.wanted(at(20)) == {}
    scaler.on_capacity(capacity("V100", 2, 25))  # still waiting with the node there: more is needed
    assert scaler.decide(at(26)) == [Add("V100", 2, 1, ("job-1",))]


def test_a_stale_request_adds_nothing() -> None:
    scaler = book(demand_ttl_s=60.0)
    scaler.on_capacity(capacity("V100", 2, 0))
    assert scaler.decide(at(61)) == []


def test_an_idle_node_is_drained_once_past_its_lifetime_then_removed_when_the_pool_shows_it_drained() -> None:
    scaler = book(min_lifetime_s=30.0)
    alive_node(scaler, added=0, up=5)
    scaler.on_reclaim(reclaim("auto-v100-0", 20))
    assert scaler.decide(at(20)) == []  # younger than its lifetime: no flapping
    assert scaler.decide(at(30)) == [Drain("auto-v100-0")]
    assert scaler.nodes["auto-v100-0"].phase is Phase.DRAINING
    assert scaler.decide(at(31)) == []
    scaler.on_node_state(state("auto-v100-0", 32, draining=True))
    assert scaler.decide(at(33)) == [Remove("auto-v100-0", RemoveReason.IDLE)]
    scaler.on_removed("auto-v100-0")
    assert scaler.nodes == {}


def test_a_draining_node_still_busy_is_removed_only_once_idle() -> None:
    scaler = book()
    alive_node(scaler)
    scaler.on_reclaim(reclaim("auto-v100-0", 31))
    assert scaler.decide(at(31)) == [Drain("auto-v100-0")]
    scaler.on_node_state(state("auto-v100-0", 32, draining=True, allocated_gpus=(0,)))
    assert scaler.decide(at(33)) == []
    scaler.on_node_state(state("auto-v100-0", 40, draining=True))
    assert scaler.decide(at(41)) == [Remove("auto-v100-0", RemoveReason.IDLE)]


def test_a_draining_node_is_kept_when_demand_for_its_model_returns_and_nothing_is_added_for_it() -> None:
    scaler = book()
    alive_node(scaler)
    scaler.on_reclaim(reclaim("auto-v100-0", 31))
    assert scaler.decide(at(31)) == [Drain("auto-v100-0")]
    scaler.on_node_state(state("auto-v100-0", 32, draining=True, allocated_gpus=(0,)))
    scaler.on_capacity(capacity("V100", 2, 33))

    assert scaler.decide(at(34)) == [Undrain("auto-v100-0")]  # inside the cooldown too: no removal is under way
    assert scaler.nodes["auto-v100-0"].phase is Phase.ALIVE
    scaler.on_node_state(state("auto-v100-0", 36, draining=True))  # the pool does not show the undrain yet
    assert scaler.decide(at(43)) == []  # the request it answers adds nothing; the undrain waits for its retry
    assert scaler.decide(at(44)) == [Undrain("auto-v100-0")]
    scaler.on_node_state(state("auto-v100-0", 47))
    assert scaler.decide(at(60)) == []
    scaler.on_capacity(capacity("V100", 2, 61))  # a later request: the scheduler still waits, so more are added
    assert scaler.decide(at(62)) == [Add("V100", 2, 1, ("job-1",))]


def test_a_drain_the_pool_does_not_show_is_sent_again() -> None:
    scaler = book(drain_retry_s=10.0)
    alive_node(scaler)
    scaler.on_reclaim(reclaim("auto-v100-0", 31))
    assert scaler.decide(at(31)) == [Drain("auto-v100-0")]
    assert scaler.decide(at(40)) == []
    assert scaler.decide(at(41)) == [Drain("auto-v100-0")]


def test_a_node_busy_since_it_was_reported_idle_is_not_drained() -> None:
    scaler = book()
    alive_node(scaler)
    scaler.on_reclaim(reclaim("auto-v100-0", 31))
    scaler.on_node_state(state("auto-v100-0", 32, allocated_gpus=(0, 1)))
    assert scaler.decide(at(33)) == []
    scaler.on_node_state(state("auto-v100-0", 50))  # idle again, but not reported idle since: stays
    assert scaler.decide(at(51)) == []
    scaler.on_reclaim(reclaim("auto-v100-0", 60))
    assert scaler.decide(at(60)) == [Drain("auto-v100-0")]


def test_the_min_nodes_floor_is_never_crossed() -> None:
    scaler = book(min_nodes=1)
    alive_node(scaler, "auto-v100-0")
    alive_node(scaler, "auto-v100-1", added=1, up=6)
    scaler.on_reclaim(reclaim("auto-v100-0", 40))
    scaler.on_reclaim(reclaim("auto-v100-1", 40))
    assert scaler.decide(at(41)) == [Drain("auto-v100-0")]  # the oldest; the other stays
    scaler.on_node_state(state("auto-v100-0", 42, draining=True))
    assert scaler.decide(at(60)) == [Remove("auto-v100-0", RemoveReason.IDLE)]
    scaler.on_removed("auto-v100-0")
    assert scaler.decide(at(90)) == []
    assert scaler.nodes["auto-v100-1"].phase is Phase.ALIVE


def test_no_node_of_a_model_still_wanted_is_drained() -> None:
    scaler = book(max_nodes=1)
    alive_node(scaler)
    scaler.on_reclaim(reclaim("auto-v100-0", 31))
    scaler.on_capacity(capacity("V100", 4, 31))  # a larger gang waits for V100s (no room to add)
    assert scaler.decide(at(32)) == []


def test_a_lost_node_is_removed_and_a_failed_removal_is_retried_after_the_cooldown() -> None:
    scaler = book(cooldown_s=10.0)
    alive_node(scaler)
    scaler.on_node_state(state("auto-v100-0", 20, status=NodeStatus.LOST))
    assert scaler.decide(at(21)) == [Remove("auto-v100-0", RemoveReason.LOST)]
    scaler.on_remove_failed("auto-v100-0", at(21))
    assert scaler.nodes["auto-v100-0"].phase is Phase.ALIVE
    assert scaler.decide(at(25)) == []
    assert scaler.decide(at(31)) == [Remove("auto-v100-0", RemoveReason.LOST)]


def test_the_state_of_an_earlier_node_of_that_name_is_not_this_ones() -> None:
    scaler = book()
    scaler.on_added(["auto-v100-0"], "V100", 2, at(100))
    scaler.on_node_state(state("auto-v100-0", 50))  # the compacted topic's last word on the node removed before
    scaler.on_reclaim(reclaim("auto-v100-0", 60))
    node = scaler.nodes["auto-v100-0"]
    assert node.phase is Phase.JOINING and node.reclaimable_at is None


def test_adopt_takes_the_providers_nodes_as_joining_and_forgets_the_gone() -> None:
    scaler = book()
    scaler.on_added(["auto-v100-0"], "V100", 2, at(0))
    gone = scaler.adopt([ProvidedNode("auto-a100-1", "a100", 1, T0.timestamp())])
    assert [node.node_id for node in gone] == ["auto-v100-0"]
    assert list(scaler.nodes) == ["auto-a100-1"]
    assert scaler.nodes["auto-a100-1"].phase is Phase.JOINING and scaler.nodes["auto-a100-1"].gpu_model == "A100"
    assert scaler.counts() == {("A100", "JOINING"): 1}


def test_every_phase_has_transitions_and_an_illegal_move_is_refused() -> None:
    assert set(TRANSITIONS) == set(Phase)
    node = Managed("n", "V100", 2, T0)
    with pytest.raises(AssertionError):
        node.move(Phase.DRAINING)  # a node that never came ALIVE is not drained
