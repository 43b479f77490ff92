"""The committed JSON Schemas in ``schemas/`` match the event models; regenerate with
``python -m shardyard.schemas schemas``."""

import json
from pathlib import Path

import jsonschema
import pytest

from shardyard.schemas import generate, render

SCHEMAS = Path(__file__).parents[3] / "schemas"
GENERATED = generate()


@pytest.mark.parametrize("name", sorted(GENERATED), ids=str)
def test_committed_schema_matches_the_models(name: str) -> None:
    path = SCHEMAS / name
    assert path.is_file(), f"{path} is missing: run python -m shardyard.schemas schemas"
    assert path.read_text() == render(GENERATED[name]), f"{name} drifted: run python -m shardyard.schemas schemas"


def test_no_stale_schema_files() -> None:
    assert {p.name for p in SCHEMAS.glob("*.json")} == set(GENERATED)


def test_the_s15_example_validates_against_the_submission_schema() -> None:
    example = json.loads((Path(__file__).parents[3] / "examples" / "fine_tune_gpt2.json").read_text())
    jsonschema.validate(example, GENERATED["job-submission.json"])
