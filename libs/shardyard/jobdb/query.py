"""What a reader of the accounting database asks for, parsed once for ``shardyard history`` and ``/api/history``.

``--since`` takes a duration back from now (``90s``, ``15m``, ``2h``, ``7d``, ``1w``, or several: ``1h30m``) or an ISO
8601 time (``2026-05-01``, ``2026-05-01T12:00:00+02:00``; without a zone, UTC). As ``sacct --starttime`` does, it
selects the jobs that were in the system at any time since then: those that have not ended, and those that ended
at or after it.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from shardyard.errors import ConfigError
from shardyard.job_state import JobState

DEFAULT_LIMIT: Final = 1000
MAX_LIMIT: Final = 100_000
UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


@dataclass(frozen=True)
class HistoryQuery:
    since: datetime | None = None
    state: JobState | None = None
    job_id: str | None = None
    limit: int = DEFAULT_LIMIT
    """At most this many rows, the newest submissions first."""


def parse_since(text: str, now: datetime) -> datetime:
    """``text`` as an instant: a duration before ``now``, or an ISO 8601 time (UTC when it names no zone)."""
    value = text.strip().lower()
    if value and _DURATION.sub("", value) == "":
        seconds = sum(float(n) * UNITS[unit] for n, unit in _DURATION.findall(value))
        return now - timedelta(seconds=seconds)
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"--since takes a duration (90s, 15m, 2h, 7d, 1w, 1h30m) or an ISO 8601 time, not {text!r}"
        ) from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def parse_state(text: str) -> JobState:
    try:
        return JobState(text.strip().upper())
    except ValueError:
        raise ConfigError(f"--state is one of {', '.join(JobState)}, not {text!r}") from None


def parse_limit(text: str) -> int:
    if not text.strip().isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise ConfigError(f"--limit is a number of rows, 1 to {MAX_LIMIT}, not {text!r}")
    return int(text)


def query_of(params: Mapping[str, str], now: datetime) -> HistoryQuery:
    """The query of ``since``, ``state``, ``job`` and ``limit`` (absent or empty: no filter, the default limit), as
    the CLI's options and the API's query string give them. Raises ConfigError naming what is wrong."""

    def given(name: str) -> str | None:
        value = params.get(name)
        return value if value else None

    since, state, limit = given("since"), given("state"), given("limit")
    return HistoryQuery(
        since=parse_since(since, now) if since else None,
        state=parse_state(state) if state else None,
        job_id=given("job"),
        limit=parse_limit(limit) if limit else DEFAULT_LIMIT,
    )
