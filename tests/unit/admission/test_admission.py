from __future__ import annotations

from typing import Any

import pytest

from shardyard.admission import Admitted, Refused, admit
from shardyard.events import RejectReason
from shardyard.gpus import DEFAULT_TFLOPS
from tests.unit.builders import EXAMPLE, GIB, T0, raw, submission

FALLBACK = "invalid-0-7"


def _admit(data: bytes) -> Admitted | Refused:
    return admit(data, catalogue=DEFAULT_TFLOPS, submitted_at=T0, fallback_id=FALLBACK)


def _with_gpu(**gpu: Any) -> dict[str, Any]:
    document = submission()
    document["resource_requirements"]["gpu"] = {**document["resource_requirements"]["gpu"], **gpu}
    return document


def _with_resources(**fields: Any) -> dict[str, Any]:
    document = submission()
    document["resource_requirements"] = {**document["resource_requirements"], **fields}
    return document


def _without(field: str) -> dict[str, Any]:
    document = submission()
    del document[field]
    return document


def test_the_s15_example_is_admitted_verbatim() -> None:
    result = _admit(EXAMPLE.read_bytes())

    assert isinstance(result, Admitted)
    spec = result.spec
    assert (spec.job_id, spec.task_type, spec.priority) == ("fine_tune_gpt2", "micro_train", 5)
    assert (spec.gpu_count, spec.gpu_model, spec.min_tflops) == (2, "A100", 35.0)
    assert spec.memory_bytes == 64 * 1024**3
    assert (spec.cpu_cores, spec.shard_count, spec.sync_interval) == (8.0, 2, 100)
    assert (spec.model_path, spec.dataset_path) == ("/data/models/gpt2_pretrained", "/data/datasets/wikitext")
    assert spec.submitted_at == T0
    assert (spec.memory_per_shard, spec.cpu_per_shard) == (32 * GIB, 4.0)


@pytest.mark.parametrize(
    ("document", "field", "value"),
    [
        pytest.param(_with_gpu(model="NVIDIA A100-SXM4-80GB"), "gpu_model", "A100", id="model-canonicalised"),
        pytest.param(_with_gpu(min_flops=None), "min_tflops", 35.0, id="min-tflops-from-catalogue"),
        pytest.param(_with_gpu(model="V100", min_flops=None), "min_tflops", 15.0, id="v100-catalogue"),
        pytest.param(_with_gpu(model=None, min_flops=None), "min_tflops", 0.0, id="any-model"),
        pytest.param(_with_gpu(model="Z900", min_flops=50), "gpu_model", "Z900", id="unknown-model-with-min-flops"),
        pytest.param(_with_gpu(model="Z900", min_flops=50), "min_tflops", 50.0, id="unknown-model-min-flops-kept"),
        pytest.param(_without("shard_count"), "shard_count", 2, id="shard-count-defaults-to-gpus"),
        pytest.param(_with_resources(memory=1024), "memory_bytes", 1024, id="memory-as-int"),
        pytest.param(_with_resources(memory="32GB"), "memory_bytes", 32 * 1000**3, id="memory-decimal"),
        pytest.param(_without("priority"), "priority", 0, id="priority-default"),
        pytest.param(submission(training={"max_steps": 5}), "max_steps", 5, id="training-knob"),
        pytest.param(submission(), "depends_on", (), id="depends-on-default"),
        pytest.param(submission(depends_on=["prep", "tok"]), "depends_on", ("prep", "tok"), id="depends-on"),
        pytest.param(submission(depends_on=["b", "a", "b"]), "depends_on", ("b", "a"), id="depends-on-repeat-dropped"),
        pytest.param(submission(), "on_dependency_failure", "fail", id="on-dependency-failure-default"),
        pytest.param(submission(on_dependency_failure="hold"), "on_dependency_failure", "hold", id="hold"),
        pytest.param(submission(), "min_match", None, id="min-match-default-full-match-only"),
        pytest.param(submission(), "max_wait_s", 0.0, id="max-wait-default"),
        pytest.param(submission(placement={"min_match": 0.4, "max_wait_s": 60}), "min_match", 0.4, id="min-match"),
        pytest.param(submission(placement={"min_match": 0.4, "max_wait_s": 60}), "max_wait_s", 60.0, id="max-wait"),
        pytest.param(submission(placement={"min_match": 1}), "max_wait_s", 0.0, id="max-wait-placement-default"),
        pytest.param(submission(), "preemptible", True, id="preemptible-default"),
        pytest.param(submission(preemptible=False), "preemptible", False, id="not-preemptible"),
    ],
)
def test_admitted_fields(document: dict[str, Any], field: str, value: object) -> None:
    result = _admit(raw(document))

    assert isinstance(result, Admitted), result
    assert getattr(result.spec, field) == value


@pytest.mark.parametrize(
    ("data", "reason", "job_id"),
    [
        pytest.param(b"{not json", RejectReason.MALFORMED_JSON, FALLBACK, id="not-json"),
        pytest.param(b"\xff\xfe", RejectReason.MALFORMED_JSON, FALLBACK, id="not-utf8"),
        pytest.param(b"", RejectReason.MALFORMED_JSON, FALLBACK, id="empty"),
        pytest.param(raw([submission()]), RejectReason.NOT_AN_OBJECT, FALLBACK, id="json-list"),
        pytest.param(raw("fine_tune_gpt2"), RejectReason.NOT_AN_OBJECT, FALLBACK, id="json-string"),
        pytest.param(raw(_without("dependencies")), RejectReason.MISSING_FIELD, "fine_tune_gpt2", id="missing-deps"),
        pytest.param(raw(_without("task_id")), RejectReason.MISSING_FIELD, FALLBACK, id="missing-task-id"),
        pytest.param(raw(_with_gpu(count="two")), RejectReason.WRONG_TYPE, "fine_tune_gpt2", id="count-string"),
        pytest.param(raw(_with_gpu(count=2.0)), RejectReason.WRONG_TYPE, "fine_tune_gpt2", id="count-float"),
        pytest.param(raw(_with_resources(gpu="A100")), RejectReason.WRONG_TYPE, "fine_tune_gpt2", id="gpu-string"),
        pytest.param(
            raw(_with_gpu(count=0, min_flops=None)), RejectReason.INVALID_VALUE, "fine_tune_gpt2", id="count-0"
        ),
        pytest.param(
            raw(_with_gpu(model="Z900", min_flops=None)),
            RejectReason.UNKNOWN_GPU_MODEL,
            "fine_tune_gpt2",
            id="unknown-model",
        ),
        pytest.param(
            raw(submission(shard_count=3)),
            RejectReason.SHARD_COUNT_MISMATCH,
            "fine_tune_gpt2",
            id="shard-count-mismatch",
        ),
        pytest.param(raw(submission(gpus=2)), RejectReason.UNKNOWN_FIELD, "fine_tune_gpt2", id="unknown-field"),
        pytest.param(
            raw(_with_resources(memory="64 parsecs")),
            RejectReason.INVALID_VALUE,
            "fine_tune_gpt2",
            id="bad-memory-unit",
        ),
        pytest.param(raw(_with_resources(memory=True)), RejectReason.INVALID_VALUE, "fine_tune_gpt2", id="memory-bool"),
        pytest.param(
            raw(submission(priority=-1)), RejectReason.INVALID_VALUE, "fine_tune_gpt2", id="priority-negative"
        ),
        pytest.param(raw(submission(task_id="no spaces!")), RejectReason.INVALID_VALUE, FALLBACK, id="bad-task-id"),
        pytest.param(raw(submission(task_id=7)), RejectReason.WRONG_TYPE, FALLBACK, id="task-id-int"),
        pytest.param(
            raw(submission(depends_on=["fine_tune_gpt2"])), RejectReason.INVALID_VALUE, "fine_tune_gpt2", id="self-dep"
        ),
        pytest.param(raw(submission(depends_on="prep")), RejectReason.WRONG_TYPE, "fine_tune_gpt2", id="deps-string"),
        pytest.param(
            raw(submission(depends_on=["no spaces!"])), RejectReason.INVALID_VALUE, "fine_tune_gpt2", id="deps-bad-id"
        ),
        pytest.param(
            raw(submission(on_dependency_failure="retry")),
            RejectReason.INVALID_VALUE,
            "fine_tune_gpt2",
            id="on-dependency-failure-unknown",
        ),
        pytest.param(
            raw(submission(placement={"min_match": 0})), RejectReason.INVALID_VALUE, "fine_tune_gpt2", id="min-match-0"
        ),
        pytest.param(
            raw(submission(placement={"min_match": 1.5})),
            RejectReason.INVALID_VALUE,
            "fine_tune_gpt2",
            id="min-match-above-1",
        ),
        pytest.param(raw(submission(placement={})), RejectReason.MISSING_FIELD, "fine_tune_gpt2", id="placement-empty"),
        pytest.param(
            raw(submission(placement={"min_match": 0.5, "max_wait_s": -1})),
            RejectReason.INVALID_VALUE,
            "fine_tune_gpt2",
            id="max-wait-negative",
        ),
        pytest.param(
            raw(submission(preemptible="yes")), RejectReason.WRONG_TYPE, "fine_tune_gpt2", id="preemptible-str"
        ),
        pytest.param(
            EXAMPLE.read_bytes().replace(b'"min_flops": 35', b'"min_flops": Infinity'),
            RejectReason.INVALID_VALUE,
            "fine_tune_gpt2",
            id="min-flops-infinity",
        ),
    ],
)
def test_refused(data: bytes, reason: RejectReason, job_id: str) -> None:
    result = _admit(data)

    assert isinstance(result, Refused), result
    assert (result.reason, result.job_id) == (reason, job_id)
    assert result.message


@pytest.mark.parametrize(
    ("document", "field"),
    [
        pytest.param(_with_gpu(count=0), "resource_requirements.gpu.count", id="count-0"),
        pytest.param(_with_gpu(count="two"), "resource_requirements.gpu.count", id="count-string"),
        pytest.param(_without("dependencies"), "dependencies", id="missing-deps"),
        pytest.param(submission(gpus=2), "gpus", id="unknown-field"),
        pytest.param(_with_resources(memory="64 parsecs"), "resource_requirements.memory", id="bad-memory"),
        pytest.param(_with_gpu(model="Z900", min_flops=None), "resource_requirements.gpu.model", id="unknown-model"),
        pytest.param(submission(depends_on=["ok", "bad id"]), "depends_on.1", id="bad-dependency-id"),
        pytest.param(submission(placement={"min_match": 2}), "placement.min_match", id="min-match-too-high"),
    ],
)
def test_refusal_names_the_field(document: dict[str, Any], field: str) -> None:
    result = _admit(raw(document))

    assert isinstance(result, Refused)
    assert field in [error.field for error in result.errors]
    assert field in result.message or result.reason is RejectReason.UNKNOWN_GPU_MODEL


def test_refusal_shows_the_bad_input() -> None:
    result = _admit(raw(_with_resources(memory="64 parsecs")))

    assert isinstance(result, Refused)
    (error,) = result.errors
    assert error.input == '"64 parsecs"'
    assert "parsecs" in error.problem


def test_an_elastic_submission_carries_its_range_to_the_spec() -> None:
    document = submission() | {"elasticity": {"min_shards": 1, "max_shards": 4}}

    result = _admit(raw(document))

    assert isinstance(result, Admitted)
    assert result.spec.elasticity is not None
    assert (result.spec.elasticity.min_shards, result.spec.shard_count, result.spec.elasticity.max_shards) == (1, 2, 4)
    assert isinstance(plain := _admit(raw(submission())), Admitted) and plain.spec.elasticity is None


@pytest.mark.parametrize("sizes", [{"min_shards": 3, "max_shards": 4}, {"min_shards": 1, "max_shards": 1}])
def test_an_elastic_range_that_leaves_out_the_preferred_size_is_refused_naming_it(sizes: dict[str, int]) -> None:
    result = _admit(raw(submission() | {"elasticity": sizes}))

    assert isinstance(result, Refused)
    assert result.reason is RejectReason.SHARD_COUNT_MISMATCH
    assert "min_shards" in result.message and "max_shards" in result.message and "shard_count (2" in result.message
