"""A shard's progress report as its event (``shardyard.node_agent.reports``): dated when its step ended."""

from datetime import UTC, datetime, timedelta

import pytest

from shardyard.node_agent.reports import MAX_AGO_S, progress

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
KEY = ("job-1", 1, 2)


@pytest.mark.parametrize(
    ("ago_s", "dated_back_s"),
    [
        pytest.param(None, 0.0, id="a-line-of-a-shard-that-does-not-tell"),
        pytest.param(0.0, 0.0, id="a-line-read-at-once"),
        pytest.param(2.5, 2.5, id="read-late-or-the-last-step-told-after-a-failed-sync"),
        pytest.param(-4.0, 0.0, id="never-in-the-future"),
        pytest.param(1e5, MAX_AGO_S, id="at-most-the-bound"),
        pytest.param(NOW.timestamp(), 0.0, id="at-0-is-none"),
        pytest.param("soon", 0.0, id="not-a-number"),
    ],
)
def test_a_progress_report_is_dated_when_its_step_ended(ago_s: object, dated_back_s: float) -> None:
    report: dict[str, object] = {"kind": "progress", "step": 139, "loss": 2.0}
    if ago_s is not None:
        report["at"] = NOW.timestamp() - ago_s if isinstance(ago_s, float) else ago_s
    event = progress("node-a", KEY, report, now=NOW)
    assert event.occurred_at == NOW - timedelta(seconds=dated_back_s)
    assert (event.job_id, event.shard_index, event.attempt, event.step) == ("job-1", 1, 2, 139)
