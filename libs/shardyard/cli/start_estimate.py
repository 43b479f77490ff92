"""A waiting job's estimated start as the terminal says it, counted from now: ``starts in ~12 min, 90 %: within 30
min`` in ``shardyard status JOB``, ``~12m (90%: 30m)`` in ``shardyard jobs -o wide``. Pure: the monitor's job JSON
and the time now in, text out.

The scheduler estimates two starts (``docs/architecture/placement.md``): the median (p50), as likely to come early
as late, and the p90, by which 90 % of its plan's samples of the running gangs' run times have the job started. The
p50 says about when; the p90 is the time worth planning around. A wait is said in the unit a person would use:
seconds under 2 minutes, minutes under 2 hours, hours beyond.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

SECONDS_UNDER_S = 120.0
MINUTES_UNDER_S = 7200.0


def wait_text(seconds: float, *, short: bool = False) -> str:
    """``45 s``, ``12 min``, ``3 h`` (``short``: ``45s``, ``12m``, ``3h``), rounded to the unit; a start already
    due (the estimate is republished only when it moves materially, so it can lag a little) reads as 0."""
    left = max(0.0, seconds)
    if left < SECONDS_UNDER_S:
        amount, unit = left, ("s", " s")
    elif left < MINUTES_UNDER_S:
        amount, unit = left / 60, ("m", " min")
    else:
        amount, unit = left / 3600, ("h", " h")
    return f"{int(amount + 0.5)}{unit[0] if short else unit[1]}"


def start_estimate(job: dict[str, Any], now: datetime, *, short: bool = False) -> str:
    """``starts in ~12 min, 90 %: within 30 min`` (``short``: ``~12m (90%: 30m)``) for a job whose view carries an
    estimated start, without the 90 % part when only the p50 is known; "" when it carries none (it is not waiting
    on capacity, or the plan cannot say when)."""
    p50, p90 = job.get("estimated_start"), job.get("estimated_start_p90")
    if not p50:
        return ""
    median = wait_text((datetime.fromisoformat(p50) - now).total_seconds(), short=short)
    if not p90:
        return f"~{median}" if short else f"starts in ~{median}"
    likely = wait_text((datetime.fromisoformat(p90) - now).total_seconds(), short=short)
    return f"~{median} (90%: {likely})" if short else f"starts in ~{median}, 90 %: within {likely}"
