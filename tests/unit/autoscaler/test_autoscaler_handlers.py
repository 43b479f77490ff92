"""The handlers carry the book's decisions out: a provider that fails is counted and the service goes on; drains go
on the bus. A small real fake provider and bus, no broker."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY

from shardyard.autoscale.provider import ProvidedNode, ProviderError
from shardyard.autoscaler.app import AutoscalerSettings
from shardyard.autoscaler.book import AutoscaleBook, AutoscalePolicy, Phase
from shardyard.autoscaler.handlers import AutoscalerHandlers
from shardyard.bus.topics import ELASTICITY, NODE_STATE
from shardyard.errors import ConfigError
from shardyard.events import CapacityRequested, Event, NodeDrain, ReclaimCandidate
from shardyard.settings import load_settings
from tests.support.clock import FakeClock
from tests.unit.builders import T0, at, gpus, node_state


@dataclass
class FakeProvider:
    failing: bool = False
    name: str = "fake"
    managed: dict[str, ProvidedNode] = field(default_factory=dict)

    def add(self, gpu_model: str, gpus_per_node: int, count: int) -> list[str]:
        if self.failing:
            raise ProviderError("no capacity in the zone")
        ids = [f"fake-{len(self.managed) + k}" for k in range(count)]
        for node_id in ids:
            self.managed[node_id] = ProvidedNode(node_id, gpu_model, gpus_per_node, T0.timestamp())
        return ids

    def remove(self, node_id: str) -> None:
        if self.failing:
            raise ProviderError("the API said no")
        self.managed.pop(node_id, None)

    def nodes(self) -> list[ProvidedNode]:
        return list(self.managed.values())

    def close(self) -> None:
        self.managed.clear()


@dataclass
class FakeBus:
    published: list[Event] = field(default_factory=list)

    async def publish(self, event: Event) -> None:
        self.published.append(event)


def handlers(provider: FakeProvider, clock: FakeClock) -> tuple[AutoscalerHandlers, FakeBus]:
    policy = AutoscalePolicy(node_gpus={"V100": 2}, max_nodes=2, cooldown_s=5, min_lifetime_s=0)
    bus = FakeBus()
    found = AutoscalerHandlers(AutoscaleBook(policy), provider, bus, clock)  # type: ignore[arg-type]
    found.live = True
    return found, bus


def drains(bus: FakeBus) -> list[tuple[str, bool]]:
    return [(e.node_id, e.draining) for e in bus.published if isinstance(e, NodeDrain)]


def actions(action: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("shardyard_autoscaler_actions_total", {"action": action, "outcome": outcome}) or 0


def request(when: datetime) -> CapacityRequested:
    return CapacityRequested(occurred_at=when, gpu_model="V100", min_tflops=15, gpus=2, jobs=("j",), waiting_s=1)


async def test_a_request_adds_through_the_provider_and_an_idle_node_is_drained_then_removed() -> None:
    clock = FakeClock(at(1))
    provider = FakeProvider()
    scaler, bus = handlers(provider, clock)
    await scaler.on_followed(ELASTICITY, request(at(0)))
    assert list(provider.managed) == ["fake-0"]
    await scaler.on_followed(NODE_STATE, node_state("fake-0", occurred_at=at(2), gpus=gpus("V100", 2, 15)))
    assert scaler.book.nodes["fake-0"].phase is Phase.ALIVE
    clock.wall = at(10)
    reclaim = ReclaimCandidate(occurred_at=at(10), node_id="fake-0", gpu_model="V100", gpus=2, idle_s=5)
    await scaler.on_followed(ELASTICITY, reclaim)
    assert drains(bus) == [("fake-0", True)]
    state = node_state("fake-0", occurred_at=at(11), gpus=gpus("V100", 2, 15), draining=True)
    await scaler.on_followed(NODE_STATE, state)
    clock.wall = at(12)
    await scaler.tick()
    assert provider.managed == {}
    assert drains(bus) == [("fake-0", True), ("fake-0", False)]  # undrained once gone: a later node of that name


async def test_a_failing_provider_is_counted_and_the_service_goes_on() -> None:
    clock = FakeClock(at(1))
    scaler, _bus = handlers(FakeProvider(failing=True), clock)
    before = actions("add", "failed")
    await scaler.on_followed(ELASTICITY, request(at(0)))
    assert actions("add", "failed") == before + 1
    assert scaler.book.nodes == {}
    clock.wall = at(7)  # past the cooldown: tried again
    await scaler.tick()
    assert actions("add", "failed") == before + 2


async def test_nothing_is_decided_while_the_log_is_caught_up_with() -> None:
    provider = FakeProvider()
    scaler, _bus = handlers(provider, FakeClock(at(1)))
    scaler.live = False
    await scaler.on_followed(ELASTICITY, request(at(0)))
    await scaler.tick()
    assert provider.managed == {}


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--gpus", "A100"], "MODEL:COUNT"),
        (["--gpus", "A100:1", "--min-nodes", "3", "--max-nodes", "2"], "min_nodes"),
        (["--gpus", "A100:1"], "run_dir"),
        (["--gpus", "A100:1", "--provider", "command", "--add-command", "add"], "remove_command"),
    ],
    ids=["bad-gpus", "min-above-max", "local-without-run-dir", "command-without-remove"],
)
def test_bad_settings_are_refused_with_what_is_wrong(argv: list[str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_settings(AutoscalerSettings, argv, {}, prog="shardyard-autoscaler")


def test_settings_make_the_policy() -> None:
    argv = [
        "--gpus",
        "a100:2",
        "--gpus",
        "V100:1",
        "--provider",
        "command",
        "--add-command",
        "a",
        "--remove-command",
        "r",
    ]
    settings: Any = load_settings(AutoscalerSettings, argv, {}, prog="shardyard-autoscaler")
    assert dict(settings.policy().node_gpus) == {"A100": 2, "V100": 1}
    assert settings.node_provider().name == "command"
