"""The book that turns the alert rules (``monitor/rules.py``) into firing and resolved events (the log of them is
``monitor/alert_log.py``).

Pure: ``AlertBook.evaluate(view, now)`` reads no clock and performs nothing; it returns the events to publish. One
evaluation runs in three phases:

1. **conditions** (``monitor/rules.py``): every rule lists what holds now, per subject, with ``since`` where the
   data say when it began (a node's last heartbeat, a job's last progress, the moment its pending reason appeared);
2. **for**: a condition is due once it has held its rule's ``for`` duration, counted from ``since`` or, where the
   data give none, from when this book first saw it;
3. **transitions**: due conditions the view does not show firing fire; alerts the view shows firing whose
   condition no longer holds resolve.

Transitions are judged against the alerts the view folded from the alerts topic (``AlertLog``), not against what
this replica decided before, so every monitor replica converges on the one history of that topic. A replica holds
back a transition it published until the view echoes it. Two replicas that decide the same transition within the
time one's event takes to reach the other (tens of milliseconds, against a 0.5 s evaluation period) both publish it:
the log may hold such a duplicate. It changes nothing: ``AlertLog`` ignores a firing of an alert already firing and a
resolution whose ``since`` is not the firing's, and the event ids, made from (rule, subject, since, kind), are equal
where ``since`` comes from the data, so any other consumer can drop them too.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shardyard.events import AlertFiring, AlertResolved, AlertRule
from shardyard.events.alert import alert_event_id, alert_key
from shardyard.monitor.condition import Condition
from shardyard.monitor.rules import RULES, AlertPolicy, conditions
from shardyard.monitor.views import ClusterView

RESEND_AFTER_S = 5.0
"""A transition this replica published and the view has not echoed within this long is published again."""


# --- the book: phases 2 and 3 ---------------------------------------------------------------------------------------
@dataclass
class AlertBook:
    """One replica's evaluator: ``for`` clocks of conditions without a data ``since``, and its unechoed transitions."""

    policy: AlertPolicy = field(default_factory=AlertPolicy)
    pending: dict[str, datetime] = field(default_factory=dict)
    """Alert key -> when this book first saw its condition (rules whose data give no ``since``)."""
    sent: dict[str, tuple[str, datetime]] = field(default_factory=dict)
    """Alert key -> (event type, when) of a transition published and not yet seen in the view."""

    def judges(self, rule: AlertRule, subject: str) -> bool:
        """Whether this replica can tell that an alert ended: another replica's consumer lag is not measured here."""
        return rule in RULES and (rule is not AlertRule.CONSUMER_LAG or subject == self.policy.lag_subject)

    def evaluate(self, view: ClusterView, now: datetime) -> list[AlertFiring | AlertResolved]:
        holding = conditions(view, now, self.policy)
        due = self._due(holding, now)
        firing = view.alerts.firing
        self._forget_echoed(firing, now)
        out: list[AlertFiring | AlertResolved] = []
        for key, (condition, since) in due.items():
            if key not in firing and key not in self.sent:
                out.append(_fire(condition, since, now))
        for key, alert in firing.items():
            if key not in holding and key not in self.sent and self.judges(alert.rule, alert.subject):
                out.append(_resolve(alert, now))
        for event in out:
            self.sent[alert_key(event.rule, event.subject)] = (event.type, now)
        return out

    def _due(self, holding: dict[str, Condition], now: datetime) -> dict[str, tuple[Condition, datetime]]:
        """Phase 2: conditions that held their ``for`` duration, with the start of the episode."""
        for key in [k for k in self.pending if k not in holding]:
            del self.pending[key]
        due = {}
        for key, condition in holding.items():
            since = condition.since or self.pending.setdefault(key, now)
            if now - since >= timedelta(seconds=condition.for_s):
                due[key] = (condition, since)
        return due

    def _forget_echoed(self, firing: Mapping[str, AlertFiring], now: datetime) -> None:
        for key, (kind, at) in list(self.sent.items()):
            echoed = (key in firing) == (kind == "alert.firing")
            if echoed or (now - at).total_seconds() > RESEND_AFTER_S:
                del self.sent[key]


def _fire(condition: Condition, since: datetime, now: datetime) -> AlertFiring:
    return AlertFiring(
        event_id=alert_event_id("firing", condition.rule, condition.subject, since),
        occurred_at=now,
        rule=condition.rule,
        subject=condition.subject,
        severity=condition.severity,
        summary=condition.summary,
        value=condition.value,
        threshold=condition.threshold,
        since=since,
    )


def _resolve(alert: AlertFiring, now: datetime) -> AlertResolved:
    return AlertResolved(
        event_id=alert_event_id("resolved", alert.rule, alert.subject, alert.since),
        occurred_at=now,
        rule=alert.rule,
        subject=alert.subject,
        severity=alert.severity,
        summary=f"resolved after {(now - alert.since).total_seconds():.0f} s: {alert.summary}",
        threshold=alert.threshold,
        since=alert.since,
    )


@dataclass
class CatchUp:
    """Whether the view has caught up with the log. Until then alerts are not judged: a replica replaying the topics
    sees the past (a node SUSPECT an hour ago) as the present. If its lag cannot be measured it judges anyway after
    ``give_up_after_s``."""

    started_at: float
    give_up_after_s: float = 60.0
    max_lag: int = 10
    done: bool = False

    def observe(self, lag: Mapping[str, int] | None, monotonic: float) -> bool:
        if not self.done:
            caught_up = lag is not None and sum(lag.values()) <= self.max_lag
            self.done = caught_up or monotonic - self.started_at >= self.give_up_after_s
        return self.done
