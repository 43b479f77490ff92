from __future__ import annotations

import pytest

from shardyard.gpus import DEFAULT_TFLOPS, canonical_model, catalogue_with, match_score


@pytest.mark.parametrize(
    ("name", "model"),
    [
        pytest.param("NVIDIA A100-SXM4-80GB", "A100", id="nvml-a100-sxm"),
        pytest.param("NVIDIA A100 80GB PCIe", "A100", id="nvml-a100-pcie"),
        pytest.param("Tesla V100-SXM2-16GB", "V100", id="tesla-v100"),
        pytest.param("a100", "A100", id="lower-case"),
        pytest.param("A100", "A100", id="canonical-already"),
        pytest.param("H100 80GB HBM3", "H100", id="h100-with-spaces"),
        pytest.param("NVIDIA H200", "H200", id="h200"),
        pytest.param("NVIDIA A10", "A10", id="a10-not-a100"),
        pytest.param("NVIDIA L40S", "L40S", id="l40s-not-l4"),
        pytest.param("NVIDIA L4", "L4", id="l4"),
        pytest.param("Tesla T4", "T4", id="tesla-t4"),
        pytest.param("NVIDIA GeForce RTX 4090", "RTX4090", id="geforce-rtx"),
        pytest.param("RTX-4090", "RTX4090", id="rtx-dash"),
        pytest.param("Z900", "Z900", id="unknown"),
        pytest.param("NVIDIA Z900-PCIE-40GB", "Z900", id="unknown-with-suffix"),
        pytest.param("NVIDIA L40", "L40", id="l40-is-not-l4"),
        pytest.param("NVIDIA T400", "T400", id="t400-is-not-t4"),
    ],
)
def test_canonical_model(name: str, model: str) -> None:
    assert canonical_model(name) == model


@pytest.mark.parametrize("model", sorted(DEFAULT_TFLOPS), ids=str)
def test_every_catalogue_model_is_its_own_canonical_name(model: str) -> None:
    assert canonical_model(model) == model


def test_catalogue_has_the_briefs_figures() -> None:
    assert (DEFAULT_TFLOPS["A100"], DEFAULT_TFLOPS["V100"]) == (35.0, 15.0)


@pytest.mark.parametrize(
    ("node", "required", "score"),
    [
        pytest.param(35.0, 35.0, 1.0, id="a100-for-35"),
        pytest.param(15.0, 35.0, 15 / 35, id="v100-for-35"),
        pytest.param(67.0, 35.0, 1.0, id="above-capped"),
        pytest.param(15.0, 0.0, 1.0, id="required-zero"),
        pytest.param(15.0, -1.0, 1.0, id="required-negative"),
        pytest.param(0.0, 35.0, 0.0, id="node-zero"),
    ],
)
def test_match_score(node: float, required: float, score: float) -> None:
    assert match_score(node, required) == pytest.approx(score)


def test_v100_score_is_about_point_four_three() -> None:
    assert round(match_score(15.0, 35.0), 2) == 0.43


@pytest.mark.parametrize(
    ("overrides", "model", "tflops"),
    [
        pytest.param([], "A100", 35.0, id="defaults"),
        pytest.param(["A100=19.5"], "A100", 19.5, id="override-known"),
        pytest.param(["MI300X=163.4"], "MI300X", 163.4, id="add-unknown"),
        pytest.param(["NVIDIA H100-SXM=60"], "H100", 60.0, id="canonical-name"),
    ],
)
def test_catalogue_with(overrides: list[str], model: str, tflops: float) -> None:
    assert catalogue_with(overrides)[model] == tflops


@pytest.mark.parametrize("bad", ["A100", "A100=", "=35", "A100=fast", "A100=-1", "A100=inf"], ids=str)
def test_catalogue_with_refuses_unreadable_entries(bad: str) -> None:
    with pytest.raises(ValueError, match="MODEL=TFLOPS"):
        catalogue_with([bad])


def test_queue_settings_refuse_a_bad_figure_with_a_config_error() -> None:
    from shardyard.errors import ConfigError
    from shardyard.queue.app import QueueSettings
    from shardyard.settings import load_settings

    assert load_settings(QueueSettings, ["--gpu-tflops", "MI300X=163"], {}, prog="q").gpu_tflops == ["MI300X=163"]
    with pytest.raises(ConfigError, match="gpu_tflops"):
        load_settings(QueueSettings, [], {"SHARDYARD_GPU_TFLOPS": "A100=fast"}, prog="q")
