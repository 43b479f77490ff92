"""The monitor's picture of the cluster, folded from every topic. Pure: events in, JSON-ready views out.

Folding an event is O(1) in the size of the cluster: what the alert rules and metrics read for every node (its newest
sign of life, its hottest GPU) is kept up to date here, event by event, so that judging the rules twice a second does
not walk every GPU of every node. ``revision`` counts the changes, so that a rendering of the view can be reused
until it changes (``monitor/http.py``).
"""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic_core import to_json

from shardyard.events import (
    AlertFiring,
    AlertResolved,
    AlertSeverity,
    CapacityRequested,
    FailureCause,
    Heartbeat,
    JobCancelled,
    JobPreempted,
    JobRecovering,
    LeaderElected,
    LinkMeasured,
    NodeDrain,
    NodeLease,
    NodeLeases,
    NodeLost,
    NodeState,
    NodeStatus,
    QueuesConfigured,
    ReclaimCandidate,
    RedundancyChanged,
    ServiceReady,
    ShardCheckpointed,
    ShardCompleted,
    ShardFailed,
    ShardPreempted,
    ShardProgress,
    ShardStarted,
)
from shardyard.lifecycle import TERMINAL, JobState, LifecycleFact
from shardyard.monitor.alert_log import AlertLog
from shardyard.monitor.goodput import GoodputBook
from shardyard.monitor.holding import Holding
from shardyard.monitor.jobs import JobView
from shardyard.monitor.network import Network, gang_links_json, gang_nodes, links_json
from shardyard.monitor.queues import QueueRow, queue_rows, queues_json
from shardyard.monitor.telemetry import Telemetry
from shardyard.monitor.verdicts import Verdicts

NODE_FIELDS: set[str] = {
    "node_id",
    "status",
    "draining",
    "topology",
    "gpus",
    "allocated_gpus",
    "cpu_load",
    "cpu_cores",
    "memory_bytes",
    "running",
    "output_disk",
}
"""What ``/api/nodes`` shows of a node's state (GPUs with tflops and tflops_source), beside its artifact count and its
newest sign of life as ``last_heartbeat_at``."""


@dataclass
class DeadLettered:
    """Dead letters from one topic: how many this replica has read, and the newest one."""

    count: int = 0
    last_at: datetime | None = None
    last_service: str = ""
    last_error: str = ""
    forged: int = 0
    """Of them, events refused for their seal (``x-shardyard-forged``, on a dead letter whose own seal verifies)."""
    forged_at: datetime | None = None
    forged_error: str = ""


@dataclass
class ClusterView:
    jobs: dict[str, JobView] = field(default_factory=dict)
    nodes: dict[str, NodeState] = field(default_factory=dict)
    with_status: dict[NodeStatus, dict[str, None]] = field(default_factory=lambda: {s: {} for s in NodeStatus})
    """The nodes of each status, as ``nodes`` says: the rules on SUSPECT and LOST nodes read only those."""
    heartbeats: dict[str, Heartbeat | NodeLease] = field(default_factory=dict)
    """Per node, its newest beat (a full heartbeat or a lease): its live CPU load and GPU use."""
    services: dict[str, ServiceReady] = field(default_factory=dict)
    leaders: dict[str, LeaderElected] = field(default_factory=dict)
    """Each replicated service's current leader: the election with the highest term."""
    verdicts: Verdicts = field(default_factory=Verdicts)
    """The queue's verdict on each recent submission, by where it was written (``shardyard submit`` waits for it)."""
    leadership: dict[str, Holding] = field(default_factory=dict)
    """Who holds each elected service's leadership partition, as its group coordinator said (``monitor.leadership``)."""
    preemptions: int = 0
    """Completed preemptions (JobPreempted), each counted once."""
    cancellations: int = 0
    """Jobs cancelled (JobCancelled), each counted once."""
    recoveries: int = 0
    """Recovery plans (JobRecovering), each counted once."""
    spare_ratio: float = 0.0
    failure_rate: float = 0.0
    telemetry: Telemetry = field(default_factory=Telemetry)
    alerts: AlertLog = field(default_factory=AlertLog)
    """Alerts as the alerts topic says (every monitor replica's evaluator publishes there)."""
    last_seen: dict[str, datetime] = field(default_factory=dict)
    """Per node, its newest sign of life: the pool's receipt of a heartbeat, or a heartbeat itself."""
    hottest_gpu_c: dict[str, float] = field(default_factory=dict)
    """Per node whose GPUs report a temperature: the hottest one's (Celsius)."""
    network: Network = field(default_factory=Network)
    """The links the agents measured (the links topic), less those of LOST nodes."""
    revision: int = 0
    """Changes folded so far: a rendering made at one revision holds until the next."""
    nodes_revision: int = 0
    """Node states and heartbeats folded so far (what ``nodes_body`` shows)."""
    _consumer_lag: dict[str, int] = field(default_factory=dict, repr=False)
    _dead_letters: int = field(default=0, repr=False)
    dead_lettered: dict[str, "DeadLettered"] = field(default_factory=dict)
    """Per topic the dead letters came from: how many, and the newest (what the DEAD_LETTERS rule judges)."""
    disk_full: dict[str, ShardFailed] = field(default_factory=dict)
    """Per node, its newest shard failure for want of space (DISK_FULL; what the DISK_FULL rule judges)."""
    queues: QueuesConfigured | None = None
    """The teams' queues in force (the queues topic's latest; ``monitor/queues.py``)."""
    goodput: GoodputBook = field(default_factory=GoodputBook)
    """Every job's goodput ledger (``monitor/goodput.py``)."""
    _queue_rows: tuple[int, dict[str, QueueRow]] = field(default=(-1, {}), repr=False)

    @property
    def consumer_lag(self) -> dict[str, int]:
        """Messages between this replica's position and each watched topic's end, as last measured (empty: not
        yet)."""
        return self._consumer_lag

    @consumer_lag.setter
    def consumer_lag(self, measured: dict[str, int]) -> None:
        self._consumer_lag = measured
        self.revision += 1

    @property
    def dead_letters(self) -> int:
        """Messages seen on the dead-letter topic."""
        return self._dead_letters

    @dead_letters.setter
    def dead_letters(self, count: int) -> None:
        self._dead_letters = count
        self.revision += 1

    def dead_letter(self, source_topic: str, at: datetime, service: str, error: str, *, forged: bool = False) -> None:
        """A message of ``source_topic`` reached the dead-letter topic at ``at``, sent there by ``service``;
        ``forged``: an event refused for its seal."""
        seen = self.dead_lettered.setdefault(source_topic, DeadLettered())
        seen.count += 1
        if seen.last_at is None or at >= seen.last_at:
            seen.last_at, seen.last_service, seen.last_error = at, service, error[:300]
        if forged:
            seen.forged += 1
            if seen.forged_at is None or at >= seen.forged_at:
                seen.forged_at, seen.forged_error = at, f"{service}: {error[:300]}"
        self.dead_letters += 1

    def job(self, job_id: str) -> JobView:
        return self.jobs.setdefault(job_id, JobView(job_id))

    def apply(self, event: object) -> None:
        self.revision += 1
        self.telemetry.fold(event)
        match event:
            case NodeState():
                was = self.nodes.get(event.node_id)
                if was is not None:
                    self.with_status[was.status].pop(event.node_id, None)
                self.with_status[event.status][event.node_id] = None
                self.nodes[event.node_id] = event
                self.network.node_status(event.node_id, lost=event.status is NodeStatus.LOST)
                self._seen(event.node_id)
                temperatures = [gpu.temperature_c for gpu in event.gpus if gpu.temperature_c is not None]
                if temperatures:
                    self.hottest_gpu_c[event.node_id] = max(temperatures)
                else:
                    self.hottest_gpu_c.pop(event.node_id, None)
            case Heartbeat() | NodeLease():
                self.heartbeats[event.node_id] = event
                self._seen(event.node_id)
            case NodeLeases():
                for lease in event.leases:
                    self.heartbeats[lease.node_id] = lease
                    self._seen(lease.node_id)
            case NodeDrain():
                pass  # the resource pool answers with the node's state, which carries the mark
            case ServiceReady():
                self.services[f"{event.service}/{event.instance}"] = event
            case LeaderElected():
                current = self.leaders.get(event.service)
                if current is None or event.term > current.term:
                    self.leaders[event.service] = event
            case NodeLost():
                self.network.node_status(event.node_id, lost=True)  # its state event says the same, maybe later
            case LinkMeasured():
                self.network.apply(event)
            case RedundancyChanged():
                self.spare_ratio, self.failure_rate = event.ratio, event.failure_rate
            case ShardCheckpointed():
                view = self.job(event.job_id)
                view.last_checkpoint = {"step": event.step, "dir": event.checkpoint_dir, "attempt": event.attempt}
            case ShardPreempted() | CapacityRequested() | ReclaimCandidate():
                pass  # shown through the job's preemption events; elasticity signals are for autoscalers
            case ShardFailed() if event.cause is FailureCause.DISK_FULL:
                last = self.disk_full.get(event.node_id)
                if last is None or event.occurred_at >= last.occurred_at:
                    self.disk_full[event.node_id] = event
                self.job(event.job_id).fold_shard(event)
                self.goodput.shard(event)
            case ShardProgress() | ShardFailed():
                self.job(event.job_id).fold_shard(event)
                self.goodput.shard(event)
            case ShardStarted() | ShardCompleted():
                self.job(event.job_id).fold_shard(event)
            case AlertFiring() | AlertResolved():
                self.alerts.apply(event)
            case QueuesConfigured():
                self.queues = event
            case _:
                self._lifecycle(event)  # type: ignore[arg-type]

    def _seen(self, node_id: str) -> None:
        self.nodes_revision += 1
        state, heartbeat = self.nodes.get(node_id), self.heartbeats.get(node_id)
        if state is not None and heartbeat is not None:
            self.last_seen[node_id] = max(state.last_heartbeat_at, heartbeat.occurred_at)
        elif state is not None:
            self.last_seen[node_id] = state.last_heartbeat_at
        elif heartbeat is not None:
            self.last_seen[node_id] = heartbeat.occurred_at

    def _lifecycle(self, event: LifecycleFact) -> None:
        self.verdicts.fold(event)  # a refused resubmission too: its verdict is its submitter's news
        self.goodput.lifecycle(event)  # its own transition table, as every consumer's
        if not self.job(event.job_id).fold_lifecycle(event):
            return
        match event:
            case JobPreempted():
                self.preemptions += 1
            case JobRecovering():
                self.recoveries += 1
            case JobCancelled():
                self.cancellations += 1
            case _:
                pass

    # --- JSON views ---------------------------------------------------------------------------------------------
    def jobs_json(self) -> list[dict[str, Any]]:
        return [{**view.summary(), **listed(view)} for view in self.jobs.values() if view.state is not None]

    def nodes_body(self) -> bytes:
        """``/api/nodes``: ``{"nodes": [...]}``, by node id, each node's state as pydantic serializes it (in Rust:
        a thousand nodes of 8 GPUs are ~2 MB of JSON, most of a second's work through Python dicts and ``json``).
        Beside it: its artifact count, and as ``last_heartbeat_at`` its newest sign of life, the figure the alert
        rules and ``/metrics`` use (the pool's receipt of a heartbeat, or the monitor's own, whichever is newer)."""
        shown = (
            b'{"artifact_count":%d,"last_heartbeat_at":%s,' % (len(node.artifacts), to_json(self.last_seen[node_id]))
            + to_json(node, include=NODE_FIELDS)[1:]
            for node_id, node in sorted(self.nodes.items())
        )
        return b'{"nodes":[' + b",".join(shown) + b"]}"

    def live_nodes(self) -> list[NodeState]:
        """The nodes not LOST, by id."""
        return [node for _id, node in sorted(self.nodes.items()) if node.status is not NodeStatus.LOST]

    def links_json(self, now: datetime) -> dict[str, Any]:
        """``/api/links``: the live nodes' links at ``now`` (``monitor/network.py``)."""
        return links_json(self.network.measured(now), self.live_nodes())

    def job_detail(self, job: JobView, now: datetime) -> dict[str, Any]:
        """A job's detail with its gang's links (every pair among the nodes its shards are placed on) and its goodput
        ledger to its end or to ``now`` (None: never accepted)."""
        links = gang_links_json(gang_nodes(job.placements), self.network.measured(now), self.nodes)
        ledger = self.goodput.ledger(job.job_id, now)
        goodput = ledger.to_json() if ledger is not None else None
        return {**job.detail(), **listed(job), "links": links, "goodput": goodput}

    def queues_json(self) -> dict[str, Any]:
        """``/api/queues``: each queue's quota and use per GPU model, its pending jobs and fair share."""
        return queues_json(self.queues, self.queue_rows())

    def queue_rows(self) -> dict[str, QueueRow]:
        """Each queue's row (``monitor/queues.py``), made once per revision: the rules, metrics and API share it."""
        made_at, rows = self._queue_rows
        if made_at != self.revision:
            rows = queue_rows(self.queues, self.jobs.values(), self.nodes.values())
            self._queue_rows = (self.revision, rows)
        return rows

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {state.value: 0 for state in JobState}
        for view in self.jobs.values():
            if view.state is not None:
                out[view.state.value] += 1
        return out

    def active_jobs(self) -> int:
        return sum(1 for v in self.jobs.values() if v.state is not None and v.state not in TERMINAL)

    def summary_json(self) -> dict[str, Any]:
        """The cluster at a glance, for the dashboard's header and ``shardyard status``: one request instead of
        folding every node and job in the browser (or the CLI) each second."""
        nodes = list(self.nodes.values())
        gpus = [gpu for node in nodes for gpu in node.gpus]
        return {
            "jobs": self.counts(),
            "active_jobs": self.active_jobs(),
            "nodes": {status.value: sum(1 for n in nodes if n.status is status) for status in NodeStatus},
            "draining": sum(1 for n in nodes if n.draining),
            "gpus": len(gpus),
            "gpus_allocated": sum(len(n.allocated_gpus) for n in nodes),
            "gpus_unhealthy": sum(1 for gpu in gpus if not gpu.healthy),
            "gpu_utilization": sum(gpu.utilization for gpu in gpus) / len(gpus) if gpus else None,
            "spare_ratio": self.spare_ratio,
            "failure_rate": self.failure_rate,
            "preemptions": self.preemptions,
            "recoveries": self.recoveries,
            "cancellations": self.cancellations,
            "dead_letters": self.dead_letters,
            "gpu_models": gpu_models(nodes),
            "alerts_firing": self.alerts_firing(),
            "leaders": {
                service: {"instance": e.instance, "term": e.term, "since": e.occurred_at.isoformat()}
                for service, e in sorted(self.leaders.items())
            },
        }

    def alerts_firing(self) -> dict[str, int]:
        """The alerts firing now, by severity."""
        out = dict.fromkeys(AlertSeverity, 0)
        for alert in self.alerts.firing.values():
            out[alert.severity] += 1
        return {severity.value: count for severity, count in out.items()}


def listed(job: JobView) -> dict[str, Any]:
    """Beside a job's summary in ``/api/jobs`` and ``/api/jobs/{id}``: who submitted it, to which queue, and when its
    current attempt's gang started running and the job ended (``shardyard jobs`` lists them)."""
    spec = job.spec or {}
    return {
        "owner": spec.get("owner"),
        "queue": spec.get("queue"),
        "started_at": job.running_at.isoformat() if job.running_at else None,
        "ended_at": job.ended_at.isoformat() if job.ended_at else None,
    }


def gpu_models(nodes: list[NodeState]) -> dict[str, dict[str, int]]:
    """Per GPU model, by name: its GPUs on nodes not LOST, those allocated, those faulty, and those free (healthy,
    unallocated, on an ALIVE node that is not draining: what a new job could be given now)."""
    out: dict[str, dict[str, int]] = {}
    for node in nodes:
        if node.status is NodeStatus.LOST:
            continue
        open_node = node.status is NodeStatus.ALIVE and not node.draining
        allocated = set(node.allocated_gpus)
        for gpu in node.gpus:
            counts = out.setdefault(gpu.model, {"gpus": 0, "allocated": 0, "unhealthy": 0, "free": 0})
            counts["gpus"] += 1
            counts["allocated"] += gpu.index in allocated
            counts["unhealthy"] += not gpu.healthy
            counts["free"] += open_node and gpu.healthy and gpu.index not in allocated
    return dict(sorted(out.items()))
