"""The alerts as the alerts topic says: ``AlertLog`` folds the firing and resolved events, in the topic's (one
partition's) order, into the alerts firing now and the recent transitions. The view (``monitor/views.py``) holds it;
the alert book (``monitor/alerts.py``) judges transitions against it. Pure."""

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from shardyard.events import AlertFiring, AlertResolved, AlertRule
from shardyard.events.alert import alert_key

MAX_HISTORY = 200


@dataclass
class AlertLog:
    """Alerts firing now and the recent transitions, folded from the alerts topic in its (one partition's) order."""

    firing: dict[str, AlertFiring] = field(default_factory=dict)
    history: deque[AlertFiring | AlertResolved] = field(default_factory=lambda: deque(maxlen=MAX_HISTORY))

    def apply(self, event: AlertFiring | AlertResolved) -> None:
        key = alert_key(event.rule, event.subject)
        current = self.firing.get(key)
        if isinstance(event, AlertFiring):
            if current is not None:
                return  # another replica's duplicate, or a redelivery: the first firing stands
            self.firing[key] = event
        else:
            if current is None or current.since != event.since:
                return  # a duplicate, or the end of an earlier episode
            del self.firing[key]
        self.history.append(event)

    def counts(self) -> dict[AlertRule, int]:
        out = dict.fromkeys(AlertRule, 0)
        for alert in self.firing.values():
            out[alert.rule] += 1
        return out

    def json(self, recent: int = 50) -> dict[str, Any]:
        firing = sorted(self.firing.values(), key=lambda a: (a.since, a.rule, a.subject))
        return {
            "firing": [a.model_dump(mode="json") for a in firing],
            "recent": [e.model_dump(mode="json") for e in reversed(self.history)][:recent],
        }
