from __future__ import annotations

import pytest

from shardyard.errors import ConfigError
from shardyard.node_agent import inventory
from shardyard.node_agent.inventory import MeasuredTflops, SimulatedGpus

GIB = 1024**3


@pytest.mark.parametrize(
    ("declared", "expected"),
    [
        pytest.param(["A100:2"], [("A100", 35.0, 80 * GIB)] * 2, id="a100-colon-count"),
        pytest.param(["V100x1@16GiB"], [("V100", 15.0, 16 * GIB)], id="v100-x-count-memory"),
        pytest.param(["H100"], [("H100", 67.0, 80 * GIB)], id="count-defaults-to-one"),
        pytest.param(["a100*3"], [("A100", 35.0, 80 * GIB)] * 3, id="lower-case-star"),
        pytest.param(["A100 : 1 @ 40GiB"], [("A100", 35.0, 40 * GIB)], id="spaces"),
        pytest.param(
            ["A100:2", "V100x1@16GiB"],
            [("A100", 35.0, 80 * GIB), ("A100", 35.0, 80 * GIB), ("V100", 15.0, 16 * GIB)],
            id="mixed-node",
        ),
        pytest.param([], [], id="cpu-only"),
    ],
)
def test_declared_gpus(declared: list[str], expected: list[tuple[str, float, int]]) -> None:
    gpus = SimulatedGpus(declared).probe({})

    assert [(g.model, g.tflops, g.memory_bytes) for g in gpus] == expected
    assert [g.index for g in gpus] == list(range(len(expected)))
    assert all(g.simulated and g.utilization == 0.0 and g.memory_used_bytes == 0 for g in gpus)


def test_catalogue_override() -> None:
    (gpu,) = SimulatedGpus(["A100"], catalogue={"A100": 19.5}).probe({})

    assert gpu.tflops == 19.5


@pytest.mark.parametrize(
    ("item", "message"),
    [
        pytest.param("Z900:2", "unknown GPU model", id="unknown-model"),
        pytest.param("A100:two", "cannot read", id="bad-count"),
        pytest.param("A100@16GB", "cannot read", id="decimal-memory-unit"),
        pytest.param("A100:2 extra", "cannot read", id="trailing-garbage"),
    ],
)
def test_bad_declarations(item: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SimulatedGpus([item])


def test_busy_gpus_show_utilisation() -> None:
    probe = SimulatedGpus(["A100:3"])

    idle, busy, overloaded = probe.probe({1: 0.6, 2: 1.7})

    assert (idle.utilization, idle.memory_used_bytes, idle.temperature_c) == (0.0, 0, 40.0)
    assert (busy.utilization, busy.memory_used_bytes) == (0.6, 40 * GIB)
    assert busy.temperature_c == pytest.approx(40.0 + 35.0 * 0.6)
    assert overloaded.utilization == 1.0


def test_simulated_gpus_have_no_hardware_ids() -> None:
    probe = SimulatedGpus(["A100:2"])

    assert probe.simulated is True
    assert probe.uuids() == (None, None)


def test_measured_figures_replace_the_catalogue_by_index() -> None:
    probe = MeasuredTflops(SimulatedGpus(["A100:2"]), {1: 21.5})

    first, second = probe.probe({1: 0.5})

    assert (first.tflops, first.tflops_source) == (35.0, "catalogue")
    assert (second.tflops, second.tflops_source, second.utilization) == (21.5, "measured", 0.5)
    assert probe.simulated and probe.uuids() == (None, None)


@pytest.mark.parametrize("nvml_finds_gpus", [True, False], ids=["nvml-gpus", "no-nvml"])
def test_the_probe_choice(monkeypatch: pytest.MonkeyPatch, nvml_finds_gpus: bool) -> None:
    real = SimulatedGpus(["H100:8"])  # stands in for NVML's GPUs

    def nvml(catalogue: object) -> SimulatedGpus:
        if not nvml_finds_gpus:
            raise inventory.GpuProbeUnavailable("NVML Shared Library Not Found")
        return real

    monkeypatch.setattr(inventory, "NvmlGpus", nvml)

    auto = inventory.detect(["A100:2"])
    assert auto is real if nvml_finds_gpus else [g.model for g in auto.probe({})] == ["A100", "A100"]
    simulated = inventory.detect(["A100:2"], choice="simulated")
    assert simulated is not real and [g.model for g in simulated.probe({})] == ["A100", "A100"]
    if nvml_finds_gpus:
        assert inventory.detect(["A100:2"], choice="nvml") is real
    else:
        with pytest.raises(inventory.GpuProbeUnavailable, match="NVML Shared Library Not Found"):
            inventory.detect(["A100:2"], choice="nvml")
