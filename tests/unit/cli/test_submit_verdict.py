"""``submit``'s verdict, pure parts: the monitor's verdicts by submission place, a new id, the way out of each
rejection."""

import json
import re

from shardyard.cli.verdict import way_out, with_new_id
from shardyard.events import FieldError, JobAccepted, JobRejected, RejectReason
from shardyard.monitor.verdicts import Verdicts
from tests.unit.builders import at, job_spec


def test_the_verdict_on_each_submission_is_kept_by_its_place_newest_only() -> None:
    verdicts = Verdicts(limit=2)
    verdicts.fold(JobAccepted(occurred_at=at(0), job_id="a", spec=job_spec(job_id="a"), source_offset="s/0/1"))
    refused = FieldError(field="shard_count", problem="must be at least 1")
    verdicts.fold(
        JobRejected(
            occurred_at=at(1), job_id="a", reason=RejectReason.DUPLICATE_JOB, message="seen", source_offset="s/0/2",
            errors=(refused,),
        )
    )  # fmt: skip
    assert verdicts.of("s/0/1") == {"source": "s/0/1", "outcome": "accepted", "job_id": "a", "queue": "default"}
    rejected = verdicts.of("s/0/2")
    assert rejected is not None and (rejected["outcome"], rejected["reason"]) == ("rejected", "DUPLICATE_JOB")
    assert rejected["errors"] == [{"field": "shard_count", "problem": "must be at least 1", "input": None}]
    verdicts.fold(JobAccepted(occurred_at=at(2), job_id="b", spec=job_spec(job_id="b"), source_offset="s/1/1"))
    assert verdicts.of("s/0/1") is None and verdicts.of("s/1/1") is not None


def test_a_new_id_keeps_the_document_and_suffixes_its_task_id() -> None:
    renamed = json.loads(with_new_id(json.dumps({"task_id": "ft", "priority": 3}).encode()))
    assert re.fullmatch(r"ft-[0-9a-f]{6}", renamed["task_id"]) and renamed["priority"] == 3
    assert with_new_id(b"{not json") == b"{not json"


def test_each_rejection_names_its_way_out() -> None:
    duplicate = way_out({"job_id": "ft", "reason": "DUPLICATE_JOB"}, {"state": "SUCCEEDED"})
    assert "ft exists (SUCCEEDED)" in duplicate and "--new-id" in duplicate and "shardyard status ft" in duplicate
    assert "--credentials" in way_out({"job_id": "ft", "reason": "UNAUTHENTICATED"}, None)
    assert "--anonymous-queue" in way_out({"job_id": "ft", "reason": "UNAUTHENTICATED"}, None)
    assert way_out({"job_id": "ft", "reason": "MALFORMED_JSON"}, None) == ""
