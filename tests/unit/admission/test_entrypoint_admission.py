"""Admission of a job's own command (``entrypoint``): accepted as written, or rejected with a typed reason and the
offending field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from shardyard.admission import Admitted, Refused, admit
from shardyard.events import JobAccepted, RejectReason
from shardyard.events.job import Entrypoint
from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.monitor.jobs import REDACTED
from shardyard.monitor.views import ClusterView
from shardyard.schemas import generate
from tests.unit.builders import T0, raw, submission

DDP_JOB = Path(__file__).resolve().parents[3] / "examples" / "ddp_job.json"
COMMAND = ["python", "train.py", "--steps", "10"]


def _admit(document: dict[str, Any]) -> Admitted | Refused:
    return admit(raw(document), catalogue=DEFAULT_TFLOPS, submitted_at=T0, fallback_id="invalid-0-1")


def _with(**entrypoint: Any) -> dict[str, Any]:
    return submission(entrypoint=entrypoint)


def test_a_job_without_entrypoint_runs_the_built_in_runner() -> None:
    result = _admit(submission())

    assert isinstance(result, Admitted)
    assert result.spec.entrypoint is None


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        pytest.param(_with(command=COMMAND), Entrypoint(command=COMMAND), id="command-only"),
        pytest.param(
            _with(command=COMMAND, env={"HF_HOME": "/cache", "_X1": ""}, working_dir="/data/code"),
            Entrypoint(command=COMMAND, env={"HF_HOME": "/cache", "_X1": ""}, working_dir="/data/code"),
            id="env-and-working-dir",
        ),
        pytest.param(
            _with(command=["bash", "-c", "echo $RANK; rm -rf /"]),
            Entrypoint(command=["bash", "-c", "echo $RANK; rm -rf /"]),
            id="arguments-kept-verbatim",
        ),
        pytest.param(
            _with(command=COMMAND, env={"OMP_NUM_THREADS": "4", "MASTERY": "x"}),
            Entrypoint(command=COMMAND, env={"OMP_NUM_THREADS": "4", "MASTERY": "x"}),
            id="defaults-and-lookalikes-may-be-set",
        ),
        pytest.param(
            _with(command=COMMAND, working_dir="/data//code/"),
            Entrypoint(command=COMMAND, working_dir="/data/code"),
            id="working-dir-normalised",
        ),
    ],
)
def test_admitted_entrypoints(document: dict[str, Any], expected: Entrypoint) -> None:
    result = _admit(document)

    assert isinstance(result, Admitted), result
    assert result.spec.entrypoint == expected


@pytest.mark.parametrize(
    ("entrypoint", "reason", "field"),
    [
        pytest.param({}, RejectReason.MISSING_FIELD, "entrypoint.command", id="no-command"),
        pytest.param({"command": []}, RejectReason.INVALID_VALUE, "entrypoint.command", id="empty-command"),
        pytest.param({"command": ["python", ""]}, RejectReason.INVALID_VALUE, "entrypoint.command.1", id="empty-arg"),
        pytest.param({"command": "python train.py"}, RejectReason.WRONG_TYPE, "entrypoint.command", id="shell-string"),
        pytest.param({"command": ["python", 3]}, RejectReason.WRONG_TYPE, "entrypoint.command.1", id="number-arg"),
        pytest.param({"command": ["a\x00b"]}, RejectReason.INVALID_VALUE, "entrypoint.command.0", id="nul-in-arg"),
        pytest.param({"command": COMMAND, "env": ["A=1"]}, RejectReason.WRONG_TYPE, "entrypoint.env", id="env-list"),
        pytest.param({"command": COMMAND, "env": {"A": 1}}, RejectReason.WRONG_TYPE, "entrypoint.env.A", id="number"),
        pytest.param(
            {"command": COMMAND, "env": {"1ABC": "x"}}, RejectReason.INVALID_VALUE, "entrypoint.env.1ABC", id="bad-name"
        ),
        pytest.param(
            {"command": COMMAND, "env": {"A-B": "x"}}, RejectReason.INVALID_VALUE, "entrypoint.env.A-B", id="dash-name"
        ),
        pytest.param(
            {"command": COMMAND, "env": {"RANK": "0"}}, RejectReason.INVALID_VALUE, "entrypoint.env.RANK", id="rank"
        ),
        pytest.param(
            {"command": COMMAND, "env": {"WORLD_SIZE": "8"}},
            RejectReason.INVALID_VALUE,
            "entrypoint.env.WORLD_SIZE",
            id="world-size",
        ),
        pytest.param(
            {"command": COMMAND, "env": {"LOCAL_RANK": "0"}},
            RejectReason.INVALID_VALUE,
            "entrypoint.env.LOCAL_RANK",
            id="local-rank",
        ),
        pytest.param(
            {"command": COMMAND, "env": {"MASTER_PORT": "1"}},
            RejectReason.INVALID_VALUE,
            "entrypoint.env.MASTER_PORT",
            id="master-port",
        ),
        pytest.param(
            {"command": COMMAND, "env": {"SHARDYARD_CHECKPOINT_DIR": "/x"}},
            RejectReason.INVALID_VALUE,
            "entrypoint.env.SHARDYARD_CHECKPOINT_DIR",
            id="shardyard-prefix",
        ),
        pytest.param(
            {"command": COMMAND, "working_dir": ""}, RejectReason.INVALID_VALUE, "entrypoint.working_dir", id="wd"
        ),
        pytest.param(
            {"command": COMMAND, "working_dir": 7}, RejectReason.WRONG_TYPE, "entrypoint.working_dir", id="wd-int"
        ),
        pytest.param(  # a working directory is a job path, confined like the dependencies
            {"command": COMMAND, "working_dir": "src"}, RejectReason.INVALID_VALUE, "entrypoint.working_dir", id="rel"
        ),
        pytest.param({"command": COMMAND, "shell": True}, RejectReason.UNKNOWN_FIELD, "entrypoint.shell", id="unknown"),
    ],
)
def test_rejected_entrypoints(entrypoint: Any, reason: RejectReason, field: str) -> None:
    result = _admit(submission(entrypoint=entrypoint))

    assert isinstance(result, Refused), result
    assert result.reason is reason
    assert any(e.field == field or e.field.startswith(f"{field}.") for e in result.errors), result.errors
    assert field.removeprefix("entrypoint.").split(".")[0] in result.message


def test_a_reserved_name_is_explained() -> None:
    result = _admit(submission(entrypoint={"command": COMMAND, "env": {"MASTER_ADDR": "10.0.0.9"}}))

    assert isinstance(result, Refused)
    assert "MASTER_ADDR is set by the runtime" in result.message


def test_not_an_entrypoint_object() -> None:
    result = _admit(submission(entrypoint=["python", "train.py"]))

    assert isinstance(result, Refused)
    assert result.reason is RejectReason.WRONG_TYPE


def test_the_ddp_example_job_is_admitted_and_matches_the_schema() -> None:
    document = json.loads(DDP_JOB.read_text())
    jsonschema.validate(document, generate()["job-submission.json"])

    result = _admit(document)

    assert isinstance(result, Admitted), result
    assert result.spec.entrypoint is not None
    assert result.spec.entrypoint.command[:2] == ["python", "examples/ddp_train.py"]


def test_the_entrypoint_survives_the_lifecycle_topic() -> None:
    admitted = _admit(_with(command=COMMAND, env={"A": "1"}, working_dir="/w"))
    assert isinstance(admitted, Admitted)
    event = JobAccepted(occurred_at=T0, job_id="fine_tune_gpt2", spec=admitted.spec, source_offset="s/0/1")

    decoded = JobAccepted.model_validate_json(event.model_dump_json())

    assert decoded.spec.entrypoint == admitted.spec.entrypoint


def test_the_status_api_shows_the_entrypoint_env_names_but_not_their_values() -> None:
    admitted = _admit(_with(command=COMMAND, env={"HF_TOKEN": "hf_secret", "SEED": "1"}))
    assert isinstance(admitted, Admitted)
    view = ClusterView()
    view.apply(JobAccepted(occurred_at=T0, job_id="fine_tune_gpt2", spec=admitted.spec, source_offset="s/0/1"))

    shown = view.job("fine_tune_gpt2").detail()

    assert shown["spec"]["entrypoint"]["env"] == {"HF_TOKEN": REDACTED, "SEED": REDACTED}
    assert shown["spec"]["entrypoint"]["command"] == COMMAND
    assert "hf_secret" not in json.dumps(shown)
    assert admitted.spec.entrypoint is not None and admitted.spec.entrypoint.env["HF_TOKEN"] == "hf_secret"
