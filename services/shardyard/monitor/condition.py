"""What an alert rule finds: a condition holding for one subject now (``monitor/rules.py``)."""

from dataclasses import dataclass
from datetime import datetime

from shardyard.events import AlertRule, AlertSeverity


@dataclass(frozen=True)
class Condition:
    """A rule's condition holding for one subject now."""

    rule: AlertRule
    subject: str
    severity: AlertSeverity
    summary: str
    value: float
    threshold: float
    since: datetime | None
    """When it began, where the data say; None: from when the book first saw it."""
    for_s: float = 0.0
