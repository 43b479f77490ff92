"""Every limit and confinement rule of admission, at its boundary and one past it: the bounds applied before parsing
(size, depth, values), the field ranges and lengths of the schema, job-path syntax and prefixes, and the environment
names the operator has not allowed. A rejection is typed and always small enough for the bus."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from shardyard.admission import (
    ANY_PATH,
    MAX_DEPTH,
    MAX_FIELD_ERRORS,
    MAX_SUBMISSION_BYTES,
    MAX_VALUES,
    Admitted,
    Limits,
    Policy,
    Refused,
    admit,
    named_job,
    over_limits,
)
from shardyard.events import JobRejected, RejectReason
from shardyard.events.submission import MAX_COMPONENT_BYTES, MAX_MEMORY_BYTES, MAX_PATH_BYTES, MAX_SEED, job_path
from shardyard.gpus import DEFAULT_TFLOPS
from tests.unit.builders import T0, raw, submission

OPERATOR = Policy()  # what the queue runs with by default: job paths under /data
FALLBACK = "invalid-0-9"


def _admit(data: bytes, policy: Policy = OPERATOR) -> Admitted | Refused:
    return admit(data, catalogue=DEFAULT_TFLOPS, submitted_at=T0, fallback_id=FALLBACK, policy=policy)


def _set(path: str, value: Any, document: dict[str, Any] | None = None) -> dict[str, Any]:
    """The example submission with the dotted ``path`` set to ``value``."""
    document = copy.deepcopy(document or submission())
    *parents, last = path.split(".")
    node = document
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return document


def _path_of(total_bytes: int, under: str = "/data") -> str:
    """An absolute path of exactly ``total_bytes`` bytes under ``under``, every component at most 255 bytes."""
    path = under
    while len(path) + 1 + MAX_COMPONENT_BYTES <= total_bytes:
        path += "/" + "a" * MAX_COMPONENT_BYTES
    rest = total_bytes - len(path) - 1
    return path + "/" + "b" * rest if rest > 0 else path


def _padded_to(size: int) -> bytes:
    """The example submission padded with trailing whitespace (still valid JSON) to exactly ``size`` bytes."""
    body = raw(submission())
    return body + b" " * (size - len(body))


# --- before parsing ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(_padded_to(MAX_SUBMISSION_BYTES), None, id="size-at-limit"),
        pytest.param(_padded_to(MAX_SUBMISSION_BYTES + 1), RejectReason.TOO_LARGE, id="size-one-past"),
        pytest.param(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH, None, id="depth-at-limit"),
        pytest.param(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), RejectReason.TOO_DEEP, id="depth-one-past"),
        pytest.param(b"{" * 10_000, RejectReason.TOO_DEEP, id="ten-thousand-deep-unclosed"),
        pytest.param(b'["' + b"[" * 1000 + b'"]', None, id="brackets-inside-a-string-are-text"),
        pytest.param(b'["\\"' + b"[" * 1000 + b'"]', None, id="escaped-quote-keeps-the-string-open"),
        pytest.param(b"[" + b"0," * (MAX_VALUES - 1) + b"0]", None, id="values-at-limit"),
        pytest.param(b"[" + b"0," * MAX_VALUES + b"0]", RejectReason.TOO_MANY_FIELDS, id="values-one-past"),
        pytest.param(
            json.dumps({f"k{i}": 0 for i in range(MAX_VALUES + 1)}).encode(),
            RejectReason.TOO_MANY_FIELDS,
            id="members-one-past",
        ),
    ],
)
def test_bounds_before_parsing(data: bytes, reason: RejectReason | None) -> None:
    over = over_limits(data, Limits())

    assert (over[0] if over else None) is reason


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(b"x" * (10 * 1024 * 1024), RejectReason.TOO_LARGE, id="ten-mib"),
        pytest.param(b'{"task_id": "deep", "x": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", RejectReason.TOO_DEEP),
        pytest.param(b'{"task_id": "n", "x": 1' + b"0" * 5000 + b"}", RejectReason.MALFORMED_JSON, id="5000-digits"),
        pytest.param(b"\xff\xfe{", RejectReason.MALFORMED_JSON, id="not-utf8"),
        pytest.param(b'{"task_id": "trunc', RejectReason.MALFORMED_JSON, id="truncated"),
    ],
)
def test_hostile_bytes_get_a_typed_rejection(data: bytes, reason: RejectReason) -> None:
    result = _admit(data)

    assert isinstance(result, Refused), result
    assert result.reason is reason, result


def test_bytes_over_the_limits_name_no_job_so_they_are_never_forwarded() -> None:
    body = raw(submission())
    assert named_job(body) == "fine_tune_gpt2"

    assert named_job(body + b" " * MAX_SUBMISSION_BYTES) is None
    assert named_job(b'{"task_id": "a", "x": ' + b"[" * 100 + b"]" * 100 + b"}") is None


# --- fields -----------------------------------------------------------------------------------------------------
LONGEST_PATH = _path_of(MAX_PATH_BYTES)
LONGEST_COMPONENT = "/data/" + "c" * MAX_COMPONENT_BYTES


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        pytest.param("training.seed", MAX_SEED, None, id="seed-at-limit"),
        pytest.param("training.seed", MAX_SEED + 1, RejectReason.INVALID_VALUE, id="seed-one-past"),
        pytest.param("training.seed", 10**400, RejectReason.INVALID_VALUE, id="seed-10^400"),
        pytest.param("resource_requirements.memory", MAX_MEMORY_BYTES, None, id="memory-at-limit"),
        pytest.param("resource_requirements.memory", MAX_MEMORY_BYTES + 1, RejectReason.INVALID_VALUE, id="mem-past"),
        pytest.param("resource_requirements.memory", 10**400, RejectReason.INVALID_VALUE, id="memory-10^400"),
        pytest.param("resource_requirements.memory", "9000PiB", RejectReason.INVALID_VALUE, id="memory-unit"),
        pytest.param("resource_requirements.cpu_cores", 100_000, None, id="cpu-at-limit"),
        pytest.param("resource_requirements.cpu_cores", 100_001, RejectReason.INVALID_VALUE, id="cpu-one-past"),
        pytest.param("resource_requirements.gpu.min_flops", 1_000_000.0, None, id="tflops-at-limit"),
        pytest.param("resource_requirements.gpu.min_flops", 1_000_001.0, RejectReason.INVALID_VALUE, id="tflops-past"),
        pytest.param("resource_requirements.cpu_cores", float("nan"), RejectReason.INVALID_VALUE, id="nan"),
        pytest.param("training.lr", float("inf"), RejectReason.INVALID_VALUE, id="infinity"),
        pytest.param("resource_requirements.gpu.model", "A" * 64, None, id="model-64"),
        pytest.param("resource_requirements.gpu.model", "A" * 65, RejectReason.INVALID_VALUE, id="model-65"),
        pytest.param("training.max_steps", 10_000_000, None, id="steps-at-limit"),
        pytest.param("training.max_steps", 10_000_001, RejectReason.INVALID_VALUE, id="steps-one-past"),
        pytest.param("training.lr", 10, None, id="lr-at-limit"),
        pytest.param("training.lr", 10.000001, RejectReason.INVALID_VALUE, id="lr-one-past"),
        pytest.param("sync_interval", 10_000_000, None, id="sync-at-limit"),
        pytest.param("sync_interval", 10_000_001, RejectReason.INVALID_VALUE, id="sync-one-past"),
        pytest.param("priority", 1000, None, id="priority-at-limit"),
        pytest.param("priority", 1001, RejectReason.INVALID_VALUE, id="priority-one-past"),
        pytest.param("placement", {"min_match": 0.5, "max_wait_s": 30 * 86_400}, None, id="wait-at-limit"),
        pytest.param("placement", {"min_match": 0.5, "max_wait_s": 30 * 86_400 + 1}, RejectReason.INVALID_VALUE),
        pytest.param("task_id", "j" * 128, None, id="id-at-limit"),
        pytest.param("task_id", "j" * 129, RejectReason.INVALID_VALUE, id="id-one-past"),
        pytest.param("task_id", "j\u00e9b", RejectReason.INVALID_VALUE, id="id-unicode"),
        pytest.param("task_id", "j\x00b", RejectReason.INVALID_VALUE, id="id-nul"),
        pytest.param("task_id", "<script>", RejectReason.INVALID_VALUE, id="id-html"),
        pytest.param("task_type", "t" * 64, None, id="task-type-at-limit"),
        pytest.param("task_type", "t" * 65, RejectReason.INVALID_VALUE, id="task-type-one-past"),
        pytest.param("depends_on", [], None, id="no-parents"),
        pytest.param("depends_on", [f"p{i}" for i in range(257)], RejectReason.INVALID_VALUE, id="parents-past"),
        # job paths
        pytest.param("dependencies.dataset", LONGEST_PATH, None, id="path-at-limit"),
        pytest.param("dependencies.dataset", LONGEST_PATH + "b", RejectReason.INVALID_VALUE, id="path-one-past"),
        pytest.param("dependencies.dataset", "/data/" + "x" * 5000, RejectReason.INVALID_VALUE, id="path-5000"),
        pytest.param("dependencies.dataset", LONGEST_COMPONENT, None, id="component-at-limit"),
        pytest.param("dependencies.dataset", LONGEST_COMPONENT + "c", RejectReason.INVALID_VALUE, id="component-past"),
        pytest.param("dependencies.dataset", "data/sets", RejectReason.INVALID_VALUE, id="relative"),
        pytest.param("dependencies.dataset", "/data/../../etc", RejectReason.INVALID_VALUE, id="dot-dot"),
        pytest.param("dependencies.dataset", "/data/./sets", RejectReason.INVALID_VALUE, id="dot"),
        pytest.param("dependencies.dataset", "/data/a\x00b", RejectReason.INVALID_VALUE, id="nul"),
        pytest.param("dependencies.dataset", "/data/a\nb", RejectReason.INVALID_VALUE, id="newline"),
        pytest.param("dependencies.dataset", "/data", None, id="prefix-itself"),
        pytest.param("dependencies.dataset", "/datax/sets", RejectReason.PATH_NOT_ALLOWED, id="prefix-lookalike"),
        pytest.param("dependencies.dataset", "/etc/passwd", RejectReason.PATH_NOT_ALLOWED, id="outside-prefix"),
        pytest.param("dependencies.pretrained_model", "/proc/1/cwd", RejectReason.PATH_NOT_ALLOWED, id="proc"),
        pytest.param("entrypoint", {"command": ["x"], "working_dir": "/proc/1/cwd"}, RejectReason.PATH_NOT_ALLOWED),
        pytest.param("entrypoint", {"command": ["x"], "working_dir": "/data/code"}, None, id="working-dir-ok"),
        pytest.param("entrypoint", {"command": ["x"], "working_dir": "code"}, RejectReason.INVALID_VALUE, id="wd-rel"),
        # the environment
        pytest.param("entrypoint", {"command": ["x"], "env": {"NCCL_DEBUG": "INFO"}}, None, id="env-plain"),
        pytest.param("entrypoint", {"command": ["x"], "env": {"LD_PRELOAD": "/x.so"}}, RejectReason.ENV_NOT_ALLOWED),
        pytest.param("entrypoint", {"command": ["x"], "env": {"LD_LIBRARY_PATH": "/x"}}, RejectReason.ENV_NOT_ALLOWED),
        pytest.param("entrypoint", {"command": ["x"], "env": {"PATH": "/tmp"}}, RejectReason.ENV_NOT_ALLOWED),
        pytest.param("entrypoint", {"command": ["x"], "env": {"PYTHONPATH": "/x"}}, RejectReason.ENV_NOT_ALLOWED),
        pytest.param("entrypoint", {"command": ["x"], "env": {"PYTHONHOME": "/x"}}, RejectReason.ENV_NOT_ALLOWED),
        pytest.param(
            "entrypoint", {"command": ["x"], "env": {"CUDA_VISIBLE_DEVICES": "0"}}, RejectReason.ENV_NOT_ALLOWED
        ),
        pytest.param("entrypoint", {"command": ["x"], "env": {"LD": "x"}}, None, id="env-lookalike"),
        pytest.param("entrypoint", {"command": ["x"], "env": {"V": "v" * 65_536}}, None, id="env-value-at-limit"),
        pytest.param("entrypoint", {"command": ["x"], "env": {"V": "v" * 65_537}}, RejectReason.INVALID_VALUE),
        pytest.param(
            "entrypoint", {"command": ["x"], "env": {"V": "a\x00b"}}, RejectReason.INVALID_VALUE, id="nul-env"
        ),
        pytest.param("entrypoint", {"command": ["a" * 65_536]}, None, id="argument-at-limit"),
        pytest.param("entrypoint", {"command": ["a" * 65_537]}, RejectReason.INVALID_VALUE, id="argument-one-past"),
    ],
)
def test_field_limits(field: str, value: Any, reason: RejectReason | None) -> None:
    result = _admit(raw(_set(field, value)))

    if reason is None:
        assert isinstance(result, Admitted), result
    else:
        assert isinstance(result, Refused), result
        assert result.reason is reason, result
        assert result.job_id in ("fine_tune_gpt2", FALLBACK)


@pytest.mark.parametrize(("count", "admitted"), [(4096, True), (4097, False)])
def test_gpu_count_limit(count: int, admitted: bool) -> None:
    document = _set("resource_requirements.gpu.count", count, _set("shard_count", count))

    assert isinstance(_admit(raw(document)), Admitted) is admitted


def test_a_path_is_kept_normalised() -> None:
    result = _admit(raw(_set("dependencies.dataset", "/data//datasets/wikitext/")))

    assert isinstance(result, Admitted)
    assert result.spec.dataset_path == "/data/datasets/wikitext"
    assert job_path("/data///a//b/") == "/data/a/b"


def test_the_operator_decides_the_prefixes_and_the_environment() -> None:
    outside = raw(_set("dependencies.dataset", "/mnt/corpus"))
    preload = raw(_set("entrypoint", {"command": ["x"], "env": {"LD_PRELOAD": "/opt/lib/tcmalloc.so"}}))

    assert isinstance(_admit(outside, Policy(path_prefixes=("/data", "/mnt"))), Admitted)
    assert isinstance(_admit(outside, ANY_PATH), Admitted)
    assert isinstance(_admit(preload, Policy(allowed_env=frozenset({"LD_PRELOAD"}))), Admitted)
    refused = _admit(preload)
    assert isinstance(refused, Refused)
    assert "LD_PRELOAD" in refused.message
    assert refused.errors[0].field == "entrypoint.env.LD_PRELOAD"


# --- the rejection itself is bounded --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "document",
    [
        pytest.param({f"unknown_{i}_" + "k" * 200: i for i in range(5000)}, id="thousands-of-unknown-long-keys"),
        pytest.param({"task_id": "t", "x" * 200_000: 1}, id="one-huge-key"),
        pytest.param({"task_id": "t", "task_type": ["y" * 1000] * 200}, id="long-wrong-typed-values"),
        pytest.param(_set("entrypoint", {"command": ["x"], "env": {f"LD_{i}": "x" for i in range(1000)}}), id="env"),
    ],
)
def test_a_rejection_always_fits_on_the_bus(document: dict[str, Any]) -> None:
    result = _admit(json.dumps(document).encode())

    assert isinstance(result, Refused), result
    assert len(result.errors) <= MAX_FIELD_ERRORS + 1
    event = JobRejected(
        occurred_at=T0,
        job_id=result.job_id,
        reason=result.reason,
        message=result.message,
        errors=result.errors,
        source_offset="shardyard.jobs.submissions/0/1",
    )
    assert len(event.model_dump_json()) < 64 * 1024
