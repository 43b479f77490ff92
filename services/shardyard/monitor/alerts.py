"""Alert rules over the monitor's cluster view, and the book that turns them into firing and resolved events.

Pure: ``AlertBook.evaluate(view, now)`` reads no clock and performs nothing; it returns the events to publish. One
evaluation runs in three phases:

1. **conditions**: every rule lists what holds now, per subject, with ``since`` where the data say when it began
   (a node's last heartbeat, a job's last progress, the moment its pending reason appeared);
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

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from shardyard.events import AlertFiring, AlertResolved, AlertRule, AlertSeverity, NodeStatus, PendingReason
from shardyard.events.alert import alert_event_id, alert_key
from shardyard.lifecycle import TERMINAL, JobState

if TYPE_CHECKING:  # the view holds an AlertLog and a SyncPace from here; only the rules need its type
    from shardyard.monitor.views import ClusterView, JobView

SHORTAGE: frozenset[str] = frozenset(
    {
        PendingReason.NO_NODES,
        PendingReason.NO_FIT,
        PendingReason.GPU_MODEL_MISMATCH,
        PendingReason.INSUFFICIENT_TFLOPS,
        PendingReason.INSUFFICIENT_GPUS,
        PendingReason.INSUFFICIENT_MEMORY,
        PendingReason.INSUFFICIENT_CPU,
        PendingReason.LOAD_TOO_HIGH,
    }
)
"""Pending reasons that mean the cluster lacks capacity. Waiting for a parent, an artifact, a backoff or a
higher-priority job's reservation is not a shortage of capacity."""
MAX_HISTORY = 200
RESEND_AFTER_S = 5.0
"""A transition this replica published and the view has not echoed within this long is published again."""


@dataclass(frozen=True)
class AlertPolicy:
    """Thresholds and ``for`` durations of the rules (from MonitorSettings), and whose consumer lag is judged here."""

    instance: str = "monitor"
    resource_shortage_s: float = 60.0
    sync_timeout_window_s: float = 300.0
    slow_sync_ratio: float = 1.5
    gpu_temperature_c: float = 85.0
    gpu_temperature_for_s: float = 30.0
    heartbeat_lag_s: float = 2.0
    consumer_lag_messages: int = 1000
    consumer_lag_for_s: float = 30.0
    no_progress_s: float = 120.0

    @property
    def lag_subject(self) -> str:
        return f"monitor/{self.instance}"


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


# --- what the rules read from the view (also exported as metrics, so Prometheus judges the same figures) -------
def last_heartbeat(view: ClusterView, node_id: str) -> datetime | None:
    """The newest sign of life: the pool's receipt of a heartbeat, or a heartbeat itself."""
    state, heartbeat = view.nodes.get(node_id), view.heartbeats.get(node_id)
    times = [*([state.last_heartbeat_at] if state else []), *([heartbeat.occurred_at] if heartbeat else [])]
    return max(times, default=None)


def last_progress(job: JobView) -> datetime | None:
    """When a running job last moved: its newest progress report of this attempt, or the attempt's start."""
    reports = [
        datetime.fromisoformat(shard["updated_at"])
        for shard in job.shards.values()
        if shard.get("attempt") == job.attempt and "updated_at" in shard
    ]
    starts = [job.running_at] if job.running_at else []
    return max([*reports, *starts], default=None)


def sync_ratio(job: JobView) -> float | None:
    """Observed steps between syncs over the sync interval the job asked for; above 1 when slow syncs widened it."""
    asked = (job.spec or {}).get("sync_interval")
    observed = job.sync_pace.steps_per_sync
    return observed / asked if observed is not None and asked else None


def shortage_since(job: JobView) -> datetime | None:
    """Since when an unfinished job has waited for capacity, or None when it is not waiting for capacity."""
    if job.state in TERMINAL or job.reason not in SHORTAGE:
        return None
    return job.reason_since


# --- the rules ----------------------------------------------------------------------------------------------------
Rule = Callable[["ClusterView", datetime, AlertPolicy], Iterator[Condition]]


def _age(now: datetime, since: datetime) -> float:
    return (now - since).total_seconds()


def resource_shortage(view: ClusterView, now: datetime, policy: AlertPolicy) -> Iterator[Condition]:
    for job in view.jobs.values():
        since = shortage_since(job)
        if since is not None:
            yield Condition(
                AlertRule.RESOURCE_SHORTAGE,
                job.job_id,
                AlertSeverity.WARNING,
                f"{job.job_id} waits for capacity for {_age(now, since):.0f} s: {job.reason}: {job.message}",
                _age(now, since),
                policy.resource_shortage_s,
                since,
                for_s=policy.resource_shortage_s,
            )


def sync_timeout(view: ClusterView, now: datetime, policy: AlertPolicy) -> Iterator[Condition]:
    for job in view.jobs.values():
        failed = job.sync_timeout
        if failed is not None and _age(now, failed.occurred_at) < policy.sync_timeout_window_s:
            yield Condition(
                AlertRule.SYNC_TIMEOUT,
                job.job_id,
                AlertSeverity.WARNING,
                f"{job.job_id}: shard {failed.shard_index} (attempt {failed.attempt}) on {failed.node_id} timed out "
                f"in a parameter sync {_age(now, failed.occurred_at):.0f} s ago: {failed.message}",
                _age(now, failed.occurred_at),
                policy.sync_timeout_window_s,
                failed.occurred_at,
            )


def slow_sync(view: ClusterView, _now: datetime, policy: AlertPolicy) -> Iterator[Condition]:
    for job in view.jobs.values():
        ratio = sync_ratio(job)
        if job.state is JobState.RUNNING and ratio is not None and ratio >= policy.slow_sync_ratio:
            asked = (job.spec or {}).get("sync_interval")
            yield Condition(
                AlertRule.SLOW_SYNC,
                job.job_id,
                AlertSeverity.WARNING,
                f"{job.job_id} syncs every ~{job.sync_pace.steps_per_sync:.0f} steps, {ratio:.1f}x the {asked} it "
                "asked for: slow parameter syncs widened the interval",
                ratio,
                policy.slow_sync_ratio,
                None,
            )


def _node_status(status: NodeStatus, rule: AlertRule, severity: AlertSeverity) -> Rule:
    def rule_of(view: ClusterView, now: datetime, _policy: AlertPolicy) -> Iterator[Condition]:
        for node in view.nodes.values():
            if node.status is status:
                silent = _age(now, node.last_heartbeat_at)
                yield Condition(
                    rule,
                    node.node_id,
                    severity,
                    f"{node.node_id} is {status}: no heartbeat for {silent:.1f} s",
                    silent,
                    0.0,
                    node.last_heartbeat_at,
                )

    return rule_of


def gpu_over_temperature(view: ClusterView, _now: datetime, policy: AlertPolicy) -> Iterator[Condition]:
    for node in view.nodes.values():
        if node.status is NodeStatus.LOST:
            continue  # its last figures are stale; NODE_LOST says what matters
        for gpu in node.gpus:
            if gpu.temperature_c is not None and gpu.temperature_c > policy.gpu_temperature_c:
                yield Condition(
                    AlertRule.GPU_OVER_TEMPERATURE,
                    f"{node.node_id}/gpu{gpu.index}",
                    AlertSeverity.WARNING,
                    f"{node.node_id} GPU {gpu.index} ({gpu.model}) at {gpu.temperature_c:.0f} C, "
                    f"above {policy.gpu_temperature_c:.0f} C",
                    gpu.temperature_c,
                    policy.gpu_temperature_c,
                    None,
                    for_s=policy.gpu_temperature_for_s,
                )


def heartbeat_lag(view: ClusterView, now: datetime, policy: AlertPolicy) -> Iterator[Condition]:
    """A node's newest heartbeat is old (a silent agent, before and beside SUSPECT), or the last one took long to
    arrive (a slow bus, or clock skew). A lost node is NODE_LOST's: its silence is no longer news."""
    for node_id in sorted({*view.nodes, *view.heartbeats}):
        state, last = view.nodes.get(node_id), last_heartbeat(view, node_id)
        if (state and state.status is NodeStatus.LOST) or last is None:
            continue
        age, transit = _age(now, last), view.telemetry.heartbeat_lag_s.get(node_id, 0.0)
        if max(age, transit) > policy.heartbeat_lag_s:
            yield Condition(
                AlertRule.HEARTBEAT_LAG,
                node_id,
                AlertSeverity.WARNING,
                f"{node_id}: newest heartbeat {age:.1f} s old (limit {policy.heartbeat_lag_s:g} s)"
                if age > policy.heartbeat_lag_s
                else f"{node_id}: last heartbeat took {transit:.1f} s to arrive (limit {policy.heartbeat_lag_s:g} s)",
                max(age, transit),
                policy.heartbeat_lag_s,
                last if age > policy.heartbeat_lag_s else None,
            )


def consumer_lag(view: ClusterView, _now: datetime, policy: AlertPolicy) -> Iterator[Condition]:
    behind = sum(view.consumer_lag.values())
    if behind > policy.consumer_lag_messages:
        worst = sorted(view.consumer_lag.items(), key=lambda item: -item[1])[:3]
        yield Condition(
            AlertRule.CONSUMER_LAG,
            policy.lag_subject,
            AlertSeverity.WARNING,
            f"{policy.lag_subject} is {behind} messages behind: " + ", ".join(f"{t} {n}" for t, n in worst),
            float(behind),
            float(policy.consumer_lag_messages),
            None,
            for_s=policy.consumer_lag_for_s,
        )


def no_progress(view: ClusterView, now: datetime, policy: AlertPolicy) -> Iterator[Condition]:
    for job in view.jobs.values():
        last = last_progress(job) if job.state is JobState.RUNNING else None
        if last is not None and _age(now, last) > policy.no_progress_s:
            yield Condition(
                AlertRule.NO_PROGRESS,
                job.job_id,
                AlertSeverity.WARNING,
                f"{job.job_id} (attempt {job.attempt}) reported no step for {_age(now, last):.0f} s",
                _age(now, last),
                policy.no_progress_s,
                last,
            )


RULES: Mapping[AlertRule, Rule] = {
    AlertRule.RESOURCE_SHORTAGE: resource_shortage,
    AlertRule.SYNC_TIMEOUT: sync_timeout,
    AlertRule.SLOW_SYNC: slow_sync,
    AlertRule.NODE_SUSPECT: _node_status(NodeStatus.SUSPECT, AlertRule.NODE_SUSPECT, AlertSeverity.WARNING),
    AlertRule.NODE_LOST: _node_status(NodeStatus.LOST, AlertRule.NODE_LOST, AlertSeverity.CRITICAL),
    AlertRule.GPU_OVER_TEMPERATURE: gpu_over_temperature,
    AlertRule.HEARTBEAT_LAG: heartbeat_lag,
    AlertRule.CONSUMER_LAG: consumer_lag,
    AlertRule.NO_PROGRESS: no_progress,
}


def conditions(view: ClusterView, now: datetime, policy: AlertPolicy) -> dict[str, Condition]:
    """Phase 1: every condition holding now, by alert key."""
    return {alert_key(c.rule, c.subject): c for rule in RULES.values() for c in rule(view, now, policy)}


# --- the alerts as the alerts topic says (folded into the view) ---------------------------------------------------
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


@dataclass
class SyncPace:
    """Steps between parameter syncs as rank 0's progress reports show them (the reports do not carry the interval).

    Reports come at most every 0.5 s, so the step at which the sync count is seen to rise lags the sync by up to that
    many steps; the gap between two such sightings is the interval give or take those steps. The first sighting of
    an attempt only marks the start, since the report before it need not have been a sync."""

    attempt: int = 0
    syncs: int = 0
    step: int = 0
    at_sync: bool = False
    steps_per_sync: float | None = None

    def observe(self, attempt: int, step: int, syncs: int) -> None:
        if attempt != self.attempt or syncs < self.syncs:
            self.attempt, self.syncs, self.step, self.at_sync, self.steps_per_sync = attempt, syncs, step, False, None
            return
        if syncs > self.syncs:
            if self.at_sync:
                self.steps_per_sync = (step - self.step) / (syncs - self.syncs)
            self.syncs, self.step, self.at_sync = syncs, step, True


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
