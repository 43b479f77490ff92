"""The FORGED_EVENTS rule: events refused for their seal (``shardyard.bus.seal``), as the dead letters of the
consumers that refused them tell it (``ClusterView.dead_letter``)."""

from collections.abc import Iterator
from datetime import datetime
from typing import Protocol

from shardyard.events import AlertRule, AlertSeverity
from shardyard.monitor.condition import Condition
from shardyard.monitor.views import ClusterView


class Window(Protocol):
    @property
    def dead_letter_window_s(self) -> float: ...


def forged_events(view: ClusterView, now: datetime, policy: Window) -> Iterator[Condition]:
    """Per topic, events refused for their seal within the dead-letter window: someone writes to the bus without the
    cluster secret (or under a role that may not publish them), or a component runs without it."""
    for topic, seen in sorted(view.dead_lettered.items()):
        if seen.forged_at is None:
            continue
        age = max(0.0, (now - seen.forged_at).total_seconds())
        if age <= policy.dead_letter_window_s:
            yield Condition(
                AlertRule.FORGED_EVENTS,
                topic,
                AlertSeverity.CRITICAL,
                f"{seen.forged} events of {topic} refused for their seal so far, the newest {age:.0f} s ago by "
                f"{seen.forged_error}",
                age,
                policy.dead_letter_window_s,
                seen.forged_at,
            )
