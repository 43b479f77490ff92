"""docker-compose.yml cannot run here (no Docker engine), so check it statically against the code."""

import importlib
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardyard.settings import BOOTSTRAP_ENV, ServiceSettings, load_settings

ROOT = Path(__file__).parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SHARDYARD = {name: svc for name, svc in COMPOSE["services"].items() if svc.get("image") == "shardyard:dev"}
SETTINGS = {
    "shardyard.queue": "shardyard.queue.app:QueueSettings",
    "shardyard.scheduler": "shardyard.scheduler.app:SchedulerSettings",
    "shardyard.resource_pool": "shardyard.resource_pool.app:PoolSettings",
    "shardyard.fault_manager": "shardyard.fault_manager.app:FaultSettings",
    "shardyard.monitor": "shardyard.monitor.app:MonitorSettings",
    "shardyard.node_agent": "shardyard.node_agent.app:AgentSettings",
}


def settings_class(module: str) -> type[ServiceSettings]:
    path, name = SETTINGS[module].split(":")
    cls: type[ServiceSettings] = getattr(importlib.import_module(path), name)
    return cls


def test_every_service_and_two_agents_are_there() -> None:
    modules = [svc["command"][0] for svc in SHARDYARD.values()]
    assert set(SETTINGS) <= set(modules)
    assert modules.count("shardyard.node_agent") >= 2


@pytest.mark.parametrize(
    "module", ["shardyard.queue", "shardyard.scheduler", "shardyard.resource_pool", "shardyard.fault_manager"]
)
def test_every_elected_service_runs_two_replicas_under_distinct_names(module: str) -> None:
    instances = [svc["command"][2] for svc in SHARDYARD.values() if svc["command"][0] == module]
    assert len(set(instances)) == len(instances) >= 2


def test_kafka_accepts_the_election_session_timeout() -> None:
    floor = int(COMPOSE["services"]["kafka"]["environment"]["KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS"])
    settings = settings_class("shardyard.scheduler")()
    assert floor <= settings.election_session_timeout_ms  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(SHARDYARD), ids=str)
def test_command_names_a_real_module_with_valid_flags(name: str) -> None:
    module, *argv = SHARDYARD[name]["command"]
    assert importlib.util.find_spec(f"{module}.__main__") is not None
    environment = SHARDYARD[name]["environment"]
    settings = load_settings(settings_class(module), argv, environment, prog=module)
    assert settings.bootstrap == environment[BOOTSTRAP_ENV] == "kafka:9092"


def test_dockerfile_copies_both_source_roots() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "COPY libs" in dockerfile and "COPY services" in dockerfile
