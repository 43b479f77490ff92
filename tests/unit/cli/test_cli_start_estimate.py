"""A waiting job's estimated start as ``shardyard status JOB`` and ``shardyard jobs -o wide`` say it: the p50 and the
p90, counted from now, in seconds, minutes or hours. Pure: the monitor's job JSON in, text out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shardyard.cli.start_estimate import start_estimate, wait_text

NOW = datetime(2026, 1, 1, 2, 0, 0, tzinfo=UTC)


def estimated(p50_s: float | None, p90_s: float | None = None) -> dict[str, Any]:
    """A job's view whose estimates are ``p50_s`` and ``p90_s`` seconds from now (None: not known)."""

    def at(seconds: float | None) -> str | None:
        return None if seconds is None else (NOW + timedelta(seconds=seconds)).isoformat()

    return {"job_id": "j", "state": "READY", "estimated_start": at(p50_s), "estimated_start_p90": at(p90_s)}


@pytest.mark.parametrize(
    ("seconds", "long", "short"),
    [
        pytest.param(0.0, "0 s", "0s", id="due-now"),
        pytest.param(-30.0, "0 s", "0s", id="past-due-reads-as-now"),
        pytest.param(44.6, "45 s", "45s", id="seconds-rounded"),
        pytest.param(119.0, "119 s", "119s", id="seconds-under-two-minutes"),
        pytest.param(120.0, "2 min", "2m", id="minutes-from-two"),
        pytest.param(12 * 60 + 29, "12 min", "12m", id="minutes-rounded-down"),
        pytest.param(12 * 60 + 30, "13 min", "13m", id="minutes-rounded-half-up"),
        pytest.param(7199.0, "120 min", "120m", id="minutes-under-two-hours"),
        pytest.param(7200.0, "2 h", "2h", id="hours-from-two"),
        pytest.param(5.6 * 3600, "6 h", "6h", id="hours-rounded"),
    ],
)
def test_a_wait_is_said_in_seconds_minutes_or_hours(seconds: float, long: str, short: str) -> None:
    assert (wait_text(seconds), wait_text(seconds, short=True)) == (long, short)


@pytest.mark.parametrize(
    ("job", "long", "short"),
    [
        pytest.param(
            estimated(12 * 60, 30 * 60), "starts in ~12 min, 90 %: within 30 min", "~12m (90%: 30m)", id="both"
        ),
        pytest.param(estimated(50, 3 * 3600), "starts in ~50 s, 90 %: within 3 h", "~50s (90%: 3h)", id="units-apart"),
        pytest.param(estimated(12 * 60), "starts in ~12 min", "~12m", id="p50-only"),
        pytest.param(estimated(None), "", "", id="not-known"),
        pytest.param({"job_id": "j", "state": "RUNNING"}, "", "", id="older-monitor-or-not-waiting"),
    ],
)
def test_a_waiting_jobs_start_is_its_p50_then_its_p90(job: dict[str, Any], long: str, short: str) -> None:
    assert (start_estimate(job, NOW), start_estimate(job, NOW, short=True)) == (long, short)
