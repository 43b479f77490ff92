"""``shardyard submit`` checks a document with the queue's own admission code before producing it: what the
document earns by itself is refused at once, with the id and the typed reason, and exits non-zero."""

import json
from pathlib import Path

import pytest

from shardyard.cli import client
from shardyard.cli.main import main
from shardyard.events import RejectReason

EXAMPLE = (Path(__file__).parents[3] / "examples" / "fine_tune_gpt2.json").read_bytes()
COMMENTED = b'{\n  // a comment\n  "task_id": "fine_tune_gpt2",\n  "task_type": "fine_tune"\n}'


def test_the_seeds_commented_json_is_refused_under_its_own_name_with_line_and_column() -> None:
    refused = client.check(COMMENTED)
    assert refused is not None
    assert (refused.job_id, refused.reason) == ("fine_tune_gpt2", RejectReason.MALFORMED_JSON)
    assert "line 2 column 3" in refused.message
    assert client.job_id_of(COMMENTED, 1, 7) == "fine_tune_gpt2"  # as the queue will file it


def test_a_valid_document_and_one_only_the_cluster_can_judge_pass_the_check() -> None:
    assert client.check(EXAMPLE) is None
    unknown_model = json.loads(EXAMPLE)
    unknown_model["resource_requirements"]["gpu"] = {"count": 2, "model": "Z900"}  # the cluster's catalogue may know it
    assert client.check(json.dumps(unknown_model).encode()) is None


def test_submit_of_a_bad_document_exits_non_zero_before_looking_for_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(COMMENTED)
    assert main(["--run-dir", str(tmp_path / "none"), "submit", str(bad)]) == 2
    said = capsys.readouterr().err
    assert "not submitted: fine_tune_gpt2 would be REJECTED MALFORMED_JSON" in said
