from __future__ import annotations

import pytest

from shardyard.node_agent.load import LoadSetting, LoadSource, host_load, load_source, shards_load


@pytest.mark.parametrize(
    ("setting", "simulated", "source"),
    [
        pytest.param("auto", True, "shards", id="auto-simulated"),
        pytest.param("auto", False, "host", id="auto-nvml"),
        pytest.param("host", True, "host", id="host-forced"),
        pytest.param("shards", False, "shards", id="shards-forced"),
    ],
)
def test_load_source(setting: LoadSetting, simulated: bool, source: LoadSource) -> None:
    assert load_source(setting, simulated=simulated) == source


@pytest.mark.parametrize(
    ("cores", "node_cores", "load"),
    [
        pytest.param([], 16.0, 0.0, id="idle"),
        pytest.param([0.95, 0.9], 16.0, 1.85 / 16, id="two-shards-on-16-cores"),
        pytest.param([1.0], 2.0, 0.5, id="one-busy-shard-on-2-cores"),
        pytest.param([2.5], 2.0, 1.25, id="overloaded-may-exceed-one"),
        pytest.param([-0.1, 0.5], 4.0, 0.125, id="negative-readings-ignored"),
    ],
)
def test_shards_load(cores: list[float], node_cores: float, load: float) -> None:
    assert shards_load(cores, node_cores) == pytest.approx(load)


def test_three_simulated_nodes_on_two_cores_are_not_overloaded() -> None:
    """The brief's case: 3 agents (16 declared cores each, as the local cluster declares) share a 2-core host that
    runs 2 shards. The host's load average reads ~1.0 per CPU; each node's own shards are far below 50 %."""
    host = host_load(2.1, 2)
    nodes = [shards_load([0.97], 16.0), shards_load([0.95], 16.0), shards_load([], 16.0)]

    assert host >= 0.5
    assert all(load < 0.1 for load in nodes)


def test_host_load() -> None:
    assert host_load(3.0, 4) == 0.75
    assert host_load(1.0, 0) == 1.0  # an unknown CPU count counts as one
    with pytest.raises(ValueError, match="node_cores"):
        shards_load([1.0], 0.0)
