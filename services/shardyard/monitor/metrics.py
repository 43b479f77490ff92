"""Prometheus metrics of the monitor, computed at scrape time from the cluster view.

These describe the cluster (S7): jobs and the queue, nodes and their GPUs, training progress, parameter sync,
heartbeat lag, node RTTs and links, failures and recoveries. Each process's own figures (events consumed, handler
latency, consumer lag, placement latency) are on its ``--metrics-port`` instead, see :mod:`shardyard.metrics`.

AllReduce is exported two ways. The ``_last_`` gauges describe a shard's most recent sync. The counters
``shardyard_allreduce_{seconds,bytes,syncs}_total`` sum every sync, so that
``rate(shardyard_allreduce_bytes_total[1m]) / rate(shardyard_allreduce_seconds_total[1m])`` is the transfer rate
while syncing and ``rate(seconds_total) / rate(syncs_total)`` the mean sync time;
``shardyard_shard_sync_bytes_per_second`` is one rank's rate in its last sync (bytes over its AllReduce time).

The node agents probe their links (RTT pings, short throughput bursts) and publish what they measure on the links
topic: node RTTs are those measurements (``source="measured"``) where a pair was measured recently, and the
scheduler's topology estimates (``source="topology"``) only where it was not; links' bandwidth and the links judged
slow go beside them (``monitor/network_metrics.py``, which bounds the series as pairs grow as n^2).

A 1,000-node cluster with 8 GPUs a node makes ~47,000 samples a scrape, so the families are plain ones
(``monitor/exposition.py``) written without prometheus-client's per-sample objects; ``MonitorMetrics.registry``
serves the same families to whatever reads a ``CollectorRegistry``.
"""

from collections import Counter as Tally
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric

from shardyard.clock import Clock
from shardyard.events import FailureCause, NodeLease, NodeState, NodeStatus
from shardyard.lifecycle import TERMINAL, JobState
from shardyard.monitor.exposition import FamiliesCollector, Family, Key, Kind, render
from shardyard.monitor.goodput import goodput_families
from shardyard.monitor.jobs import JobView
from shardyard.monitor.leadership import leadership_family
from shardyard.monitor.network import RTT_PAIR_NODES as RTT_PAIR_NODES  # re-exported: its home was here
from shardyard.monitor.network import Pair, mean_rtt
from shardyard.monitor.network_metrics import network_families
from shardyard.monitor.queue_metrics import queue_families
from shardyard.monitor.rules import last_heartbeat, last_progress, shortage_since, sync_ratio
from shardyard.monitor.stragglers import straggler_families
from shardyard.monitor.views import ClusterView

QUEUED = frozenset({JobState.ACCEPTED, JobState.WAITING, JobState.READY})
"""Jobs not placed yet: held by the queue, or ready and waiting for the scheduler."""
NO_REASON = "NONE"
RECOVERY_BUCKETS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0)
START_ERROR_BUCKETS_S = (1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 14_400.0)
"""Recovery spans detection (3-10 s), backoff (0-30 s) and a gang's start: seconds to minutes."""
GPU_LABELS = ("gpu", "model", "node")
"""In name order, as the exposition writes them: no reordering for each of the many GPU samples."""


class MonitorMetrics:
    """The monitor's ``/metrics``: the cluster's families and the alert rules' figures, made from the view at each
    scrape, and the events the monitor folded."""

    def __init__(self, view: ClusterView, clock: Clock | None = None) -> None:
        self.view = view
        self.clock = clock if clock is not None else view.telemetry.clock
        """What a scrape judges the links' freshness by (the view's own clock unless given)."""
        self.events = Counter("shardyard_monitor_events", "Events the monitor consumed", ["topic"], registry=None)
        self.registry = CollectorRegistry()
        """Every family, as prometheus-client objects (slow at scale: ``exposition()`` serves ``/metrics``)."""
        self.registry.register(FamiliesCollector(self.families))
        self.registry.register(self.events)

    def families(self) -> Iterator[Family | Metric]:
        yield from cluster_families(self.view, self.clock.now())
        yield from alert_families(self.view)

    def exposition(self) -> bytes:
        """The text ``generate_latest(self.registry)`` makes, an order of magnitude faster."""
        return render(self.families()).encode() + generate_latest(self.events)


def make_registry(view: ClusterView) -> tuple[CollectorRegistry, Counter]:
    metrics = MonitorMetrics(view)
    return metrics.registry, metrics.events


# --- the cluster (S7) ------------------------------------------------------------------------------------------------
def cluster_families(view: ClusterView, now: datetime) -> Iterator[Family | Metric]:
    yield from _jobs(view)
    yield _queue(view)
    yield from queue_families(view)
    yield from goodput_families(view.goodput)
    yield from _nodes(view)
    yield from _gpus(view)
    active = [job for job in view.jobs.values() if job.state is not None and job.state not in TERMINAL]
    yield from _shards(active)
    yield from _syncs(view, active)
    yield from network_families(view, now)
    yield from _faults(view)
    yield from _start_estimates(view)


def _jobs(view: ClusterView) -> Iterator[Family]:
    jobs = Family("shardyard_jobs", "Jobs by lifecycle state", ["state"])
    for state, count in view.counts().items():
        jobs.add((state,), count)
    yield jobs
    yield _one("shardyard_preemptions", "Running jobs preempted for a higher-priority job", view.preemptions, "counter")
    yield _one("shardyard_cancellations", "Jobs cancelled on a user's request", view.cancellations, "counter")
    yield _one("shardyard_recoveries", "Recovery plans carried out for failed gangs", view.recoveries, "counter")
    yield _one("shardyard_spare_ratio", "Spare shards per training shard for new gangs", view.spare_ratio)
    yield _one("shardyard_shard_failure_rate", "Recent failed shard attempts / attempts", view.failure_rate)


def _one(name: str, documentation: str, value: float, kind: Kind = "gauge") -> Family:
    family = Family(name, documentation, kind=kind)
    family.add((), value)
    return family


def _queue(view: ClusterView) -> Family:
    depth: Tally[tuple[str, str]] = Tally(
        (str((job.spec or {}).get("priority", 0)), job.reason or NO_REASON)
        for job in view.jobs.values()
        if job.state in QUEUED
    )
    queue = Family(
        "shardyard_queue_jobs",
        "Jobs not placed yet (ACCEPTED, WAITING, READY), by priority and current pending reason",
        ["priority", "reason"],
    )
    for labels, count in sorted(depth.items()):
        queue.add(labels, count)
    return queue


def _nodes(view: ClusterView) -> Iterator[Family]:
    nodes = view.nodes.values()
    by_status = Family("shardyard_nodes", "Nodes by liveness status", ["status"])
    counted = Tally(node.status for node in nodes)
    for status in NodeStatus:
        by_status.add((status.value,), counted[status])
    draining = Family("shardyard_nodes_draining", "Nodes drained by an operator (no new shards)")
    draining.add((), sum(1 for n in nodes if n.draining))
    load = Family("shardyard_node_cpu_load_ratio", "Node CPU load, 0..1", ["node"])
    for node in nodes:
        live = view.heartbeats.get(node.node_id)
        load.add((node.node_id,), live.cpu_load if live is not None else node.cpu_load)
    yield from (by_status, draining, load)


def live_use(view: ClusterView, node: NodeState) -> tuple[Sequence[float], Sequence[int]]:
    """A node's GPU utilisation and memory in use, as its newest beat reports them: the node state is published only
    when they moved by a step (the resource pool's tolerance); its heartbeats and leases say them every second."""
    beat = view.heartbeats.get(node.node_id)
    if beat is not None and beat.agent_instance == node.agent_instance:
        if isinstance(beat, NodeLease):
            use: tuple[Sequence[float], Sequence[int]] = (beat.gpu_utilization, beat.gpu_memory_used_bytes)
        else:
            use = ([g.utilization for g in beat.gpus], [g.memory_used_bytes for g in beat.gpus])
        if len(use[0]) == len(use[1]) == len(node.gpus):
            return use
    return [g.utilization for g in node.gpus], [g.memory_used_bytes for g in node.gpus]


def _gpus(view: ClusterView) -> Iterator[Family]:
    # Thousands of GPUs: one comprehension a column rather than a call a sample, and one list of label values for the
    # families that share them (written once a scrape).
    gpus = [gpu for node in view.nodes.values() for gpu in node.gpus]
    live = [live_use(view, node) for node in view.nodes.values()]
    keys: list[Key] = [(str(gpu.index), gpu.model, node.node_id) for node in view.nodes.values() for gpu in node.gpus]
    simulated: list[Key] = [(*key, "true" if gpu.simulated else "false") for key, gpu in zip(keys, gpus, strict=True)]
    hot = [(key, gpu.temperature_c) for key, gpu in zip(keys, gpus, strict=True) if gpu.temperature_c is not None]
    yield from (
        Family.columns(
            "shardyard_gpu_utilization_ratio",
            "GPU utilisation, 0..1",
            [*GPU_LABELS, "simulated"],
            simulated,
            [used for utilization, _memory in live for used in utilization],
        ),
        Family.columns(
            "shardyard_gpu_memory_used_bytes",
            "GPU memory in use",
            GPU_LABELS,
            keys,
            [held for _utilization, memory in live for held in memory],
        ),
        Family.columns(
            "shardyard_gpu_memory_total_bytes",
            "GPU memory installed",
            GPU_LABELS,
            keys,
            [gpu.memory_bytes for gpu in gpus],
        ),
        Family.columns(
            "shardyard_gpu_temperature_celsius",
            "GPU temperature",
            GPU_LABELS,
            [key for key, _celsius in hot] if len(hot) < len(keys) else keys,
            [celsius for _key, celsius in hot],
        ),
        Family.columns(
            "shardyard_gpu_healthy",
            "1 while the GPU takes shards, 0 once faulted",
            GPU_LABELS,
            keys,
            [1 if gpu.healthy else 0 for gpu in gpus],
        ),
    )


def _shards(active: Sequence[JobView]) -> Iterator[Family]:
    """Training progress of every shard of a job that has not ended; an ended job's series end with it."""
    labels = ("job", "shard")
    step = Family("shardyard_shard_step", "Last reported training step", labels)
    loss = Family("shardyard_shard_loss", "Last reported training loss", labels)
    rate = Family("shardyard_shard_samples_per_second", "Training throughput", labels)
    sync = Family("shardyard_allreduce_last_seconds", "Duration of the last parameter AllReduce", labels)
    sync_bytes = Family("shardyard_allreduce_last_bytes", "Bytes of the last parameter AllReduce", labels)
    cpu = Family("shardyard_shard_cpu_ratio", "Shard process CPU use, 0..n", labels)
    transfer = Family(
        "shardyard_shard_sync_bytes_per_second",
        "A rank's data-transfer rate in its last parameter sync: the sync's bytes over its AllReduce time",
        ("job", "node", "shard"),
    )
    for job in active:
        for index, shard in job.shards.items():
            values = (job.job_id, str(index))
            step.add(values, shard.get("step", 0))
            if "loss" in shard:
                loss.add(values, shard["loss"])
                rate.add(values, shard.get("samples_per_s", 0.0))
                sync.add(values, shard.get("allreduce_ms", 0.0) / 1000.0)
                sync_bytes.add(values, shard.get("allreduce_bytes", 0))
                cpu.add(values, shard.get("cpu_percent", 0.0) / 100.0)
                if shard.get("allreduce_ms", 0.0) > 0 and shard.get("allreduce_bytes", 0) > 0:
                    per_s = shard["allreduce_bytes"] / (shard["allreduce_ms"] / 1000.0)
                    transfer.add((job.job_id, str(shard["node_id"]), str(index)), per_s)
    yield from (step, loss, rate, sync, sync_bytes, cpu, transfer)


def _syncs(view: ClusterView, active: Sequence[JobView]) -> Iterator[Family]:
    labels = ("job", "shard")
    seconds = Family("shardyard_allreduce_seconds", "Time spent in parameter AllReduce", labels, kind="counter")
    sent = Family("shardyard_allreduce_bytes", "Bytes of parameter AllReduce", labels, kind="counter")
    count = Family("shardyard_allreduce_syncs", "Parameter AllReduce operations", labels, kind="counter")
    running = {job.job_id for job in active}
    for (job_id, index), totals in sorted(view.telemetry.syncs.items()):
        if job_id in running:
            values = (job_id, str(index))
            seconds.add(values, totals.seconds)
            sent.add(values, totals.bytes)
            count.add(values, totals.count)
    yield from (seconds, sent, count)


def mean_rtt_ms(nodes: Sequence[NodeState], measured: Mapping[Pair, float] | None = None) -> dict[str, float]:
    """Each node's mean RTT to the others, measured where ``measured`` has the pair, else the scheduler's topology
    estimate (``monitor/network.py``'s ``mean_rtt``, without the source)."""
    return {node_id: ms for node_id, (ms, _source) in mean_rtt(nodes, measured or {}).items()}


def _faults(view: ClusterView) -> Iterator[Family | Metric]:
    telemetry = view.telemetry
    failures = Family("shardyard_shard_failures", "Failed shard attempts by cause", ["cause"], kind="counter")
    for cause in FailureCause:
        failures.add((cause.value,), telemetry.shard_failures.get(cause, 0))
    yield failures
    yield _histogram(
        "shardyard_recovery_seconds",
        "From a job's recovery plan (job.recovering) to its re-formed gang's first training progress",
        telemetry.recovery_s,
        RECOVERY_BUCKETS_S,
    )


def _histogram(name: str, documentation: str, values: Sequence[float], bounds: Sequence[float]) -> Metric:
    """A histogram of ``values`` (all of them: the telemetry keeps them) with upper ``bounds``."""
    cumulative = [(str(bound), sum(1 for v in values if v <= bound)) for bound in bounds]
    return HistogramMetricFamily(
        name, documentation, buckets=[*cumulative, ("+Inf", len(values))], sum_value=sum(values)
    )


def _start_estimates(view: ClusterView) -> Iterator[Family | Metric]:
    yield _histogram(
        "shardyard_start_estimate_error_seconds",
        "How far a placed job's start was from its estimated (p50) start, early or late",
        [abs(error) for error in view.telemetry.start_error_s],
        START_ERROR_BUCKETS_S,
    )
    late = sum(1 for error in view.telemetry.start_error_s if error > 0)
    yield _one("shardyard_start_estimates_late", "Placed jobs that started after their estimated (p50) start", late)
    after_p90 = sum(1 for error in view.telemetry.start_error_p90_s if error > 0)
    yield _one("shardyard_start_estimates_after_p90", "Placed jobs that started after their p90 start", after_p90)


# --- what the alert rules judge ----------------------------------------------------------------------------------
def alert_families(view: ClusterView) -> Iterator[Family]:
    """The alerts firing, and what the alert rules judge, so that Prometheus can judge the same figures
    (``deploy/prometheus/alerts.yml``). Ages go out as Unix timestamps (a rule takes ``time() - x``): a scrape
    needs no clock."""
    firing = Family("shardyard_alerts_firing", "Alerts firing now, by rule", ["rule"])
    for rule, count in view.alerts.counts().items():
        firing.add((rule.value,), count)
    lag = Family(
        "shardyard_monitor_consumer_lag_messages",
        "Messages between this monitor replica's position and the end of each topic it reads",
        ["topic"],
    )
    for topic, behind in sorted(view.consumer_lag.items()):
        lag.add((topic,), behind)
    dead = Family(
        "shardyard_dead_letter_last_timestamp_seconds",
        "Unix time of the newest dead letter from each topic (its messages nobody could use)",
        ["topic"],
    )
    forged = Family(
        "shardyard_forged_event_last_timestamp_seconds",
        "Unix time of the newest event of each topic refused for its seal (shardyard.bus.seal), as dead-lettered",
        ["topic"],
    )
    for topic, seen in sorted(view.dead_lettered.items()):
        if seen.last_at is not None:
            dead.add((topic,), seen.last_at.timestamp())
        if seen.forged_at is not None:
            forged.add((topic,), seen.forged_at.timestamp())
    yield from (firing, lag, dead, forged, leadership_family(view), *_node_liveness(view), *_job_progress(view))
    yield from (*_node_disks(view), *straggler_families(view))


def _node_liveness(view: ClusterView) -> Iterator[Family]:
    status = Family("shardyard_node_status", "1 for a node's liveness status, else 0", ["node", "status"])
    heartbeat = Family(
        "shardyard_node_last_heartbeat_timestamp_seconds", "Unix time of a node's newest heartbeat", ["node"]
    )
    statuses = [(value, value.value) for value in NodeStatus]
    for node_id in sorted({*view.nodes, *view.heartbeats}):
        state, last = view.nodes.get(node_id), last_heartbeat(view, node_id)
        if state is not None:
            for value, name in statuses:
                status.add((node_id, name), 1 if state.status is value else 0)
        if last is not None:
            heartbeat.add((node_id,), last.timestamp())
    yield from (status, heartbeat)


def _job_progress(view: ClusterView) -> Iterator[Family]:
    waiting = Family(
        "shardyard_job_capacity_wait_since_timestamp_seconds",
        "Unix time since which a job has waited for capacity, by its pending reason",
        ["job", "reason"],
    )
    progress = Family(
        "shardyard_job_last_progress_timestamp_seconds",
        "Unix time of a running job's newest training progress, or of its attempt's start",
        ["job"],
    )
    ratio = Family(
        "shardyard_job_sync_interval_ratio",
        "A running job's observed steps between parameter syncs over the sync_interval it asked for",
        ["job"],
    )
    timeout = Family(
        "shardyard_job_sync_timeout_timestamp_seconds",
        "Unix time of a job's newest shard failure by SYNC_TIMEOUT",
        ["job"],
    )
    for job in view.jobs.values():
        since, last, widened = shortage_since(job), last_progress(job), sync_ratio(job)
        if since is not None:
            waiting.add((job.job_id, str(job.reason)), since.timestamp())
        if job.state is JobState.RUNNING and last is not None:
            progress.add((job.job_id,), last.timestamp())
        if job.state is JobState.RUNNING and widened is not None:
            ratio.add((job.job_id,), widened)
        if job.sync_timeout is not None:
            timeout.add((job.job_id,), job.sync_timeout.occurred_at.timestamp())
    yield from (waiting, progress, ratio, timeout)


def _node_disks(view: ClusterView) -> Iterator[Family]:
    """What the DISK_FULL rule judges: each node's output disk, and its newest DISK_FULL shard failure."""
    free = Family("shardyard_node_disk_free_bytes", "Free space of a node's output disk (checkpoints)", ["node"])
    total = Family("shardyard_node_disk_total_bytes", "Size of a node's output disk (checkpoints)", ["node"])
    failed = Family(
        "shardyard_node_disk_full_timestamp_seconds",
        "Unix time of a node's newest shard failure by DISK_FULL",
        ["node"],
    )
    for node_id, node in sorted(view.nodes.items()):
        if node.output_disk is not None:
            free.add((node_id,), node.output_disk.free_bytes)
            total.add((node_id,), node.output_disk.total_bytes)
    for node_id, event in sorted(view.disk_full.items()):
        failed.add((node_id,), event.occurred_at.timestamp())
    yield from (free, total, failed)
