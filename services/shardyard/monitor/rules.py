"""The alert rules: phase 1 of an evaluation (``monitor/alerts.py`` has the other two). Each rule lists what holds now,
per subject, with ``since`` where the data say when it began (a node's last heartbeat, a job's last progress, the
moment its pending reason appeared). Pure: the view and ``now`` in, conditions out.

Rules run twice a second over every node and job, so each reads what the view keeps up to date per event (a node's
newest sign of life, its hottest GPU) rather than walking every heartbeat or GPU, and formats a summary only for a
condition that holds.
"""

from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Final

from shardyard.events import AlertRule, AlertSeverity, NodeStatus, PendingReason
from shardyard.events.alert import alert_key
from shardyard.lifecycle import TERMINAL, JobState
from shardyard.monitor.condition import Condition
from shardyard.monitor.forged import forged_events
from shardyard.monitor.jobs import JobView
from shardyard.monitor.leadership import leadership_hijacked, no_leader
from shardyard.monitor.network import gang_nodes
from shardyard.monitor.policy import AlertPolicy
from shardyard.monitor.stragglers import straggler
from shardyard.monitor.views import ClusterView
from shardyard.units import format_bytes

SHORTAGE: frozenset[str] = frozenset(
    {
        PendingReason.NO_NODES,
        PendingReason.NO_FIT,
        PendingReason.NEVER_FITS,
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


# --- what the rules read from the view (also exported as metrics, so Prometheus judges the same figures) -------
def last_heartbeat(view: ClusterView, node_id: str) -> datetime | None:
    """The newest sign of life: the pool's receipt of a heartbeat, or a heartbeat itself."""
    return view.last_seen.get(node_id)


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


def slow_sync(view: ClusterView, now: datetime, policy: AlertPolicy) -> Iterator[Condition]:
    """Slow syncs widened a running job's sync interval. The summary names where to look: the rank with the largest
    share of the gang's AllReduce time, and the worst measured link among the gang's nodes."""
    for job in view.jobs.values():
        ratio = sync_ratio(job)
        if job.state is JobState.RUNNING and ratio is not None and ratio >= policy.slow_sync_ratio:
            asked = (job.spec or {}).get("sync_interval")
            yield Condition(
                AlertRule.SLOW_SYNC,
                job.job_id,
                AlertSeverity.WARNING,
                f"{job.job_id} syncs every ~{job.sync_pace.steps_per_sync:.0f} steps, {ratio:.1f}x the {asked} it "
                f"asked for: slow parameter syncs widened the interval; {slowest_rank(job)}; "
                f"{worst_gang_link(view, job, now)}",
                ratio,
                policy.slow_sync_ratio,
                None,
            )


def slowest_rank(job: JobView) -> str:
    """``slowest rank 1 on node-b: 62% of the gang's AllReduce time (120.0 ms)``, from each rank's last sync as its
    latest progress report of this attempt gives it."""
    ranks = [
        (float(shard["allreduce_ms"]), index, str(shard["node_id"]))
        for index, shard in job.shards.items()
        if shard.get("attempt") == job.attempt and "allreduce_ms" in shard
    ]
    total = sum(ms for ms, _index, _node in ranks)
    if total <= 0:
        return "no rank reported an AllReduce time"
    ms, index, node = max(ranks, key=lambda rank: (rank[0], -rank[1]))
    return f"slowest rank {index} on {node}: {ms / total:.0%} of the gang's AllReduce time ({ms:.1f} ms)"


def worst_gang_link(view: ClusterView, job: JobView, now: datetime) -> str:
    """``worst link node-a|node-b: RTT 20.3 ms (slow: ...)``, among the nodes the gang is placed on."""
    measured = view.network.measured(now)
    links = measured.among(set(gang_nodes(job.placements)))
    if not links:
        return "no measured link"
    link, slow = links[0], measured.slow.get((links[0].a, links[0].b))
    return f"worst link {link.a}|{link.b}: RTT {link.rtt_ms:.1f} ms" + (f" (slow: {slow.why})" if slow else "")


def slow_link(view: ClusterView, now: datetime, policy: AlertPolicy) -> Iterator[Condition]:
    """A measured link out of line with the cluster's (``shardyard.links.slow_links``), for ``slow_link_for_s`` on
    end; it ends once the link is in line again or its measurements go stale. The value is its RTT, the threshold
    the RTT above which a link is slow (a link slow by its bandwidth alone is below it; the summary says which)."""
    measured = view.network.measured(now)
    for (a, b), slow in measured.slow.items():
        yield Condition(
            AlertRule.SLOW_LINK,
            f"{a}|{b}",
            AlertSeverity.WARNING,
            f"the link between {a} and {b} is slow: {slow.why}",
            slow.link.rtt_ms,
            measured.rtt_limit_ms or 0.0,
            None,
            for_s=policy.slow_link_for_s,
        )


ALL_NODES: Final = "*"
"""The subject of a node rule's alert grouped over many nodes (``AlertPolicy.node_alerts_grouped_over``)."""


def _grouped(rule: AlertRule, severity: AlertSeverity, nodes: list[str], what: str, policy: AlertPolicy) -> Condition:
    named = ", ".join(sorted(nodes)[:5])
    return Condition(
        rule,
        ALL_NODES,
        severity,
        f"{len(nodes)} nodes {what} at once (more than {policy.node_alerts_grouped_over}: the bus, the control plane "
        f"or the network more likely than the nodes), among them {named}",
        float(len(nodes)),
        float(policy.node_alerts_grouped_over),
        None,
    )


def _node_status(status: NodeStatus, rule: AlertRule, severity: AlertSeverity, group: bool) -> Rule:
    def rule_of(view: ClusterView, now: datetime, policy: AlertPolicy) -> Iterator[Condition]:
        nodes = [view.nodes[node_id] for node_id in view.with_status[status]]
        if group and len(nodes) > policy.node_alerts_grouped_over:
            yield _grouped(rule, severity, [node.node_id for node in nodes], f"are {status}", policy)
            return
        for node in nodes:
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
    limit = policy.gpu_temperature_c
    for node_id, hottest in view.hottest_gpu_c.items():
        node = view.nodes[node_id]
        if hottest <= limit or node.status is NodeStatus.LOST:
            continue  # a lost node's last figures are stale; NODE_LOST says what matters
        for gpu in node.gpus:
            if gpu.temperature_c is not None and gpu.temperature_c > limit:
                yield Condition(
                    AlertRule.GPU_OVER_TEMPERATURE,
                    f"{node.node_id}/gpu{gpu.index}",
                    AlertSeverity.WARNING,
                    f"{node.node_id} GPU {gpu.index} ({gpu.model}) at {gpu.temperature_c:.0f} C, above {limit:.0f} C",
                    gpu.temperature_c,
                    limit,
                    None,
                    for_s=policy.gpu_temperature_for_s,
                )


def heartbeat_lag(view: ClusterView, now: datetime, policy: AlertPolicy) -> Iterator[Condition]:
    """A node's newest heartbeat is old (a silent agent, before and beside SUSPECT), or the last one took long to
    arrive (a slow bus, or clock skew). A lost node is NODE_LOST's: its silence is no longer news."""
    limit, transits = policy.heartbeat_lag_s, view.telemetry.heartbeat_lag_s
    cutoff = now - timedelta(seconds=limit)
    lagging = [
        node_id
        for node_id, last in view.last_seen.items()
        if (last < cutoff or transits.get(node_id, 0.0) > limit)
        and ((state := view.nodes.get(node_id)) is None or state.status is not NodeStatus.LOST)
    ]
    if len(lagging) > policy.node_alerts_grouped_over:
        yield _grouped(AlertRule.HEARTBEAT_LAG, AlertSeverity.WARNING, lagging, "have lagging heartbeats", policy)
        return
    for node_id in sorted(lagging):
        last = view.last_seen[node_id]
        age, transit, silent = _age(now, last), transits.get(node_id, 0.0), last < cutoff
        yield Condition(
            AlertRule.HEARTBEAT_LAG,
            node_id,
            AlertSeverity.WARNING,
            f"{node_id}: newest heartbeat {age:.1f} s old (limit {limit:g} s)"
            if silent
            else f"{node_id}: last heartbeat took {transit:.1f} s to arrive (limit {limit:g} s)",
            max(age, transit),
            limit,
            last if silent else None,
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


def dead_letters(view: ClusterView, now: datetime, policy: AlertPolicy) -> Iterator[Condition]:
    """A topic's messages were dead-lettered within the window: each is a message nobody could act on (for the
    submissions topic, a user's job that got no verdict from the queue), kept aside with the reason."""
    for topic, seen in sorted(view.dead_lettered.items()):
        if seen.last_at is not None and _age(now, seen.last_at) <= policy.dead_letter_window_s:
            yield Condition(
                AlertRule.DEAD_LETTERS,
                topic,
                AlertSeverity.WARNING,
                f"{seen.count} messages of {topic} dead-lettered so far, the newest {_age(now, seen.last_at):.0f} s "
                f"ago by {seen.last_service}: {seen.last_error}",
                _age(now, seen.last_at),
                policy.dead_letter_window_s,
                seen.last_at,
            )


def disk_full(view: ClusterView, now: datetime, policy: AlertPolicy) -> Iterator[Condition]:
    """A node's output disk is below the floor (no new shards go there), or a shard failed DISK_FULL there within the
    window: a disk can fill past the floor in one write and empty again when the failed write is cleaned up, and the
    failure is what needs looking at. A lost node's figures are stale: NODE_LOST says what matters."""
    floor = policy.disk_floor_bytes
    for node_id, node in view.nodes.items():
        disk, failed = node.output_disk, view.disk_full.get(node_id)
        recent = failed is not None and _age(now, failed.occurred_at) < policy.disk_full_window_s
        low = disk is not None and disk.free_bytes < floor
        if not (low or recent) or node.status is NodeStatus.LOST:
            continue
        space = "free space unknown" if disk is None else f"({disk.path}): {format_bytes(disk.free_bytes)} free"
        summary = f"{node_id}'s output disk {space}, floor {policy.disk_floor}"
        if recent and failed is not None:
            summary += f"; {failed.job_id} shard {failed.shard_index} failed DISK_FULL there: {failed.message}"
        yield Condition(
            AlertRule.DISK_FULL,
            node_id,
            AlertSeverity.WARNING,
            summary,
            float(disk.free_bytes) if disk is not None else 0.0,
            float(floor),
            failed.occurred_at if recent and failed is not None else None,
        )


def queue_starved(view: ClusterView, now: datetime, _policy: AlertPolicy) -> Iterator[Condition]:
    """A team's queue has waited for its nominal quota longer than its queues file allows: a job that fits in the
    nominal has been pending with a reason since ``starving_since`` (``monitor/queues.py``)."""
    if view.queues is None:
        return
    limit = view.queues.config.starving_after_s
    for name, row in view.queue_rows().items():
        since = row.starving_since
        if since is None or _age(now, since) <= limit:
            continue
        yield Condition(
            AlertRule.QUEUE_STARVED,
            name,
            AlertSeverity.WARNING,
            f"queue {name} has waited {_age(now, since):.0f} s for its nominal quota ({row.pending_jobs} jobs "
            f"pending, fair share {row.fair_share:.2f})",
            _age(now, since),
            limit,
            since,
        )


RULES: Mapping[AlertRule, Rule] = {
    AlertRule.RESOURCE_SHORTAGE: resource_shortage,
    AlertRule.SYNC_TIMEOUT: sync_timeout,
    AlertRule.SLOW_SYNC: slow_sync,
    AlertRule.NODE_SUSPECT: _node_status(NodeStatus.SUSPECT, AlertRule.NODE_SUSPECT, AlertSeverity.WARNING, group=True),
    AlertRule.NODE_LOST: _node_status(NodeStatus.LOST, AlertRule.NODE_LOST, AlertSeverity.CRITICAL, group=False),
    AlertRule.GPU_OVER_TEMPERATURE: gpu_over_temperature,
    AlertRule.HEARTBEAT_LAG: heartbeat_lag,
    AlertRule.CONSUMER_LAG: consumer_lag,
    AlertRule.NO_PROGRESS: no_progress,
    AlertRule.DEAD_LETTERS: dead_letters,
    AlertRule.SLOW_LINK: slow_link,
    AlertRule.DISK_FULL: disk_full,
    AlertRule.QUEUE_STARVED: queue_starved,
    AlertRule.FORGED_EVENTS: forged_events,
    AlertRule.NO_LEADER: no_leader,
    AlertRule.LEADERSHIP_HIJACKED: leadership_hijacked,
    AlertRule.STRAGGLER: straggler,
}


def conditions(view: ClusterView, now: datetime, policy: AlertPolicy) -> dict[str, Condition]:
    """Phase 1: every condition holding now, by alert key."""
    return {alert_key(c.rule, c.subject): c for rule in RULES.values() for c in rule(view, now, policy)}
