"""Prometheus metrics of the monitor, computed at scrape time from the cluster view.

These describe the cluster (S7): jobs and the queue, nodes and their GPUs, training progress, parameter sync,
heartbeat lag and node RTTs, failures and recoveries. Each process's own figures (events consumed, handler latency,
consumer lag, placement latency) are on its ``--metrics-port`` instead, see :mod:`shardyard.metrics`.

AllReduce is exported two ways. The ``_last_`` gauges describe a shard's most recent sync. The counters
``shardyard_allreduce_{seconds,bytes,syncs}_total`` sum every sync, so that
``rate(shardyard_allreduce_bytes_total[1m]) / rate(shardyard_allreduce_seconds_total[1m])`` is the transfer rate
while syncing and ``rate(seconds_total) / rate(syncs_total)`` the mean sync time. Heartbeats carry no RTTs, so the
node RTTs are the scheduler's topology estimates (``source="topology"``), the figures it places gangs by.
"""

from collections import Counter as Tally
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from shardyard.events import FailureCause, NodeStatus
from shardyard.lifecycle import TERMINAL, JobState
from shardyard.monitor.alerts import last_heartbeat, last_progress, shortage_since, sync_ratio
from shardyard.monitor.views import ClusterView, JobView
from shardyard.scheduler.gangs import build_snapshot
from shardyard.scheduler.model import NodeView, estimated_rtt_ms

QUEUED = frozenset({JobState.ACCEPTED, JobState.WAITING, JobState.READY})
"""Jobs not placed yet: held by the queue, or ready and waiting for the scheduler."""
NO_REASON = "NONE"
RECOVERY_BUCKETS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0)
"""Recovery spans detection (3-10 s), backoff (0-30 s) and a gang's start: seconds to minutes."""
RTT_PAIR_NODES = 16
"""Up to this many live nodes, every pair's RTT is exported; beyond it only each node's mean (pairs grow as n^2)."""
RTT_SOURCE = "topology"


class ClusterCollector(Collector):
    def __init__(self, view: ClusterView) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        yield from self._jobs()
        yield self._queue()
        yield from self._nodes()
        yield from self._gpus()
        active = [job for job in self.view.jobs.values() if job.state is not None and job.state not in TERMINAL]
        yield from self._shards(active)
        yield from self._syncs(active)
        yield from self._network()
        yield from self._faults()

    def _jobs(self) -> Iterator[Metric]:
        view = self.view
        jobs = GaugeMetricFamily("shardyard_jobs", "Jobs by lifecycle state", labels=["state"])
        for state, count in view.counts().items():
            jobs.add_metric([state], count)
        yield jobs
        preemptions = CounterMetricFamily("shardyard_preemptions", "Running jobs preempted for a higher-priority job")
        preemptions.add_metric([], view.preemptions)
        cancellations = CounterMetricFamily("shardyard_cancellations", "Jobs cancelled on a user's request")
        cancellations.add_metric([], view.cancellations)
        recoveries = CounterMetricFamily("shardyard_recoveries", "Recovery plans carried out for failed gangs")
        recoveries.add_metric([], view.recoveries)
        spare_ratio = GaugeMetricFamily("shardyard_spare_ratio", "Spare shards per training shard for new gangs")
        spare_ratio.add_metric([], view.spare_ratio)
        failure_rate = GaugeMetricFamily("shardyard_shard_failure_rate", "Recent failed shard attempts / attempts")
        failure_rate.add_metric([], view.failure_rate)
        yield from (preemptions, cancellations, recoveries, spare_ratio, failure_rate)

    def _queue(self) -> Metric:
        view = self.view
        depth: Tally[tuple[str, str]] = Tally(
            (str((job.spec or {}).get("priority", 0)), job.reason or NO_REASON)
            for job in view.jobs.values()
            if job.state in QUEUED
        )
        queue = GaugeMetricFamily(
            "shardyard_queue_jobs",
            "Jobs not placed yet (ACCEPTED, WAITING, READY), by priority and current pending reason",
            labels=["priority", "reason"],
        )
        for (priority, reason), count in sorted(depth.items()):
            queue.add_metric([priority, reason], count)
        return queue

    def _nodes(self) -> Iterator[Metric]:
        nodes = self.view.nodes.values()
        by_status = GaugeMetricFamily("shardyard_nodes", "Nodes by liveness status", labels=["status"])
        for status in NodeStatus:
            by_status.add_metric([status.value], sum(1 for n in nodes if n.status is status))
        draining = GaugeMetricFamily("shardyard_nodes_draining", "Nodes drained by an operator (no new shards)")
        draining.add_metric([], sum(1 for n in nodes if n.draining))
        load = GaugeMetricFamily("shardyard_node_cpu_load_ratio", "Node CPU load, 0..1", labels=["node"])
        for node in nodes:
            load.add_metric([node.node_id], node.cpu_load)
        yield from (by_status, draining, load)

    def _gpus(self) -> Iterator[Metric]:
        labels = ["node", "gpu", "model"]
        util = GaugeMetricFamily(
            "shardyard_gpu_utilization_ratio", "GPU utilisation, 0..1", labels=[*labels, "simulated"]
        )
        used = GaugeMetricFamily("shardyard_gpu_memory_used_bytes", "GPU memory in use", labels=labels)
        total = GaugeMetricFamily("shardyard_gpu_memory_total_bytes", "GPU memory installed", labels=labels)
        temperature = GaugeMetricFamily("shardyard_gpu_temperature_celsius", "GPU temperature", labels=labels)
        healthy = GaugeMetricFamily(
            "shardyard_gpu_healthy", "1 while the GPU takes shards, 0 once faulted", labels=labels
        )
        for node in self.view.nodes.values():
            for gpu in node.gpus:
                values = [node.node_id, str(gpu.index), gpu.model]
                util.add_metric([*values, str(gpu.simulated).lower()], gpu.utilization)
                used.add_metric(values, gpu.memory_used_bytes)
                total.add_metric(values, gpu.memory_bytes)
                healthy.add_metric(values, 1 if gpu.healthy else 0)
                if gpu.temperature_c is not None:
                    temperature.add_metric(values, gpu.temperature_c)
        yield from (util, used, total, temperature, healthy)

    def _shards(self, active: Sequence[JobView]) -> Iterator[Metric]:
        """Training progress of every shard of a job that has not ended; an ended job's series end with it."""
        step = GaugeMetricFamily("shardyard_shard_step", "Last reported training step", labels=["job", "shard"])
        loss = GaugeMetricFamily("shardyard_shard_loss", "Last reported training loss", labels=["job", "shard"])
        rate = GaugeMetricFamily("shardyard_shard_samples_per_second", "Training throughput", labels=["job", "shard"])
        sync = GaugeMetricFamily(
            "shardyard_allreduce_last_seconds", "Duration of the last parameter AllReduce", labels=["job", "shard"]
        )
        sync_bytes = GaugeMetricFamily(
            "shardyard_allreduce_last_bytes", "Bytes of the last parameter AllReduce", labels=["job", "shard"]
        )
        cpu = GaugeMetricFamily("shardyard_shard_cpu_ratio", "Shard process CPU use, 0..n", labels=["job", "shard"])
        for job in active:
            for index, shard in job.shards.items():
                labels = [job.job_id, str(index)]
                step.add_metric(labels, shard.get("step", 0))
                if "loss" in shard:
                    loss.add_metric(labels, shard["loss"])
                    rate.add_metric(labels, shard.get("samples_per_s", 0.0))
                    sync.add_metric(labels, shard.get("allreduce_ms", 0.0) / 1000.0)
                    sync_bytes.add_metric(labels, shard.get("allreduce_bytes", 0))
                    cpu.add_metric(labels, shard.get("cpu_percent", 0.0) / 100.0)
        yield from (step, loss, rate, sync, sync_bytes, cpu)

    def _syncs(self, active: Sequence[JobView]) -> Iterator[Metric]:
        labels = ["job", "shard"]
        seconds = CounterMetricFamily("shardyard_allreduce_seconds", "Time spent in parameter AllReduce", labels=labels)
        sent = CounterMetricFamily("shardyard_allreduce_bytes", "Bytes of parameter AllReduce", labels=labels)
        count = CounterMetricFamily("shardyard_allreduce_syncs", "Parameter AllReduce operations", labels=labels)
        running = {job.job_id for job in active}
        for (job_id, index), totals in sorted(self.view.telemetry.syncs.items()):
            if job_id in running:
                values = [job_id, str(index)]
                seconds.add_metric(values, totals.seconds)
                sent.add_metric(values, totals.bytes)
                count.add_metric(values, totals.count)
        yield from (seconds, sent, count)

    def _network(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "shardyard_heartbeat_lag_seconds",
            "Arrival of a node's last heartbeat at the monitor minus its occurred_at (transit, plus clock skew)",
            labels=["node"],
        )
        for node_id, seconds in sorted(self.view.telemetry.heartbeat_lag_s.items()):
            state = self.view.nodes.get(node_id)
            if state is None or state.status is not NodeStatus.LOST:  # a lost node's last figure says nothing now
                lag.add_metric([node_id], seconds)
        yield lag
        live = [v for v in build_snapshot(self.view.nodes.values(), ()).nodes if v.status is not NodeStatus.LOST]
        pairs = GaugeMetricFamily(
            "shardyard_node_rtt_seconds",
            f"Round-trip time between two nodes (each pair once; clusters of at most {RTT_PAIR_NODES} live nodes)",
            labels=["node", "peer", "source"],
        )
        if len(live) <= RTT_PAIR_NODES:
            for i, a in enumerate(live):
                for b in live[i + 1 :]:
                    pairs.add_metric([a.node_id, b.node_id, RTT_SOURCE], estimated_rtt_ms(a, b, {}) / 1000.0)
        mean = GaugeMetricFamily(
            "shardyard_node_mean_rtt_seconds",
            "Mean round-trip time from a node to every other live node",
            labels=["node", "source"],
        )
        for node_id, ms in sorted(mean_rtt_ms(live).items()):
            mean.add_metric([node_id, RTT_SOURCE], ms / 1000.0)
        yield from (pairs, mean)

    def _faults(self) -> Iterator[Metric]:
        telemetry = self.view.telemetry
        failures = CounterMetricFamily("shardyard_shard_failures", "Failed shard attempts by cause", labels=["cause"])
        for cause in FailureCause:
            failures.add_metric([cause.value], telemetry.shard_failures.get(cause, 0))
        yield failures
        durations = telemetry.recovery_s
        cumulative = [(str(bound), sum(1 for d in durations if d <= bound)) for bound in RECOVERY_BUCKETS_S]
        yield HistogramMetricFamily(
            "shardyard_recovery_seconds",
            "From a job's recovery plan (job.recovering) to its re-formed gang's first training progress",
            buckets=[*cumulative, ("+Inf", len(durations))],
            sum_value=sum(durations),
        )


def mean_rtt_ms(nodes: Sequence[NodeView]) -> dict[str, float]:
    """Each node's mean estimated RTT to the others, in O(groups^2) rather than O(nodes^2): with nothing measured,
    the estimate depends only on the two nodes' (zone, rack), so nodes are grouped by it."""
    if len(nodes) < 2:
        return {}
    groups: dict[tuple[str, str], list[NodeView]] = {}
    for node in nodes:
        groups.setdefault((node.zone, node.rack), []).append(node)
    out: dict[str, float] = {}
    for key, members in groups.items():
        total = 0.0
        for other_key, others in groups.items():
            if other_key != key:
                total += len(others) * estimated_rtt_ms(members[0], others[0], {})
            elif len(members) > 1:
                total += (len(members) - 1) * estimated_rtt_ms(members[0], members[1], {})
        for node in members:
            out[node.node_id] = total / (len(nodes) - 1)
    return out


class AlertCollector(Collector):
    """The alerts firing, and what the alert rules judge, so that Prometheus can judge the same figures
    (``deploy/prometheus/alerts.yml``). Ages go out as Unix timestamps (a rule takes ``time() - x``): a scrape
    needs no clock."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        view = self.view
        firing = GaugeMetricFamily("shardyard_alerts_firing", "Alerts firing now, by rule", labels=["rule"])
        for rule, count in view.alerts.counts().items():
            firing.add_metric([rule.value], count)
        lag = GaugeMetricFamily(
            "shardyard_monitor_consumer_lag_messages",
            "Messages between this monitor replica's position and the end of each topic it reads",
            labels=["topic"],
        )
        for topic, behind in sorted(view.consumer_lag.items()):
            lag.add_metric([topic], behind)
        yield from (firing, lag, *self._nodes(), *self._jobs())

    def _nodes(self) -> Iterator[Metric]:
        view = self.view
        status = GaugeMetricFamily(
            "shardyard_node_status", "1 for a node's liveness status, else 0", labels=["node", "status"]
        )
        heartbeat = GaugeMetricFamily(
            "shardyard_node_last_heartbeat_timestamp_seconds", "Unix time of a node's newest heartbeat", labels=["node"]
        )
        for node_id in sorted({*view.nodes, *view.heartbeats}):
            state, last = view.nodes.get(node_id), last_heartbeat(view, node_id)
            for value in NodeStatus if state is not None else ():
                status.add_metric([node_id, value.value], 1 if state is not None and state.status is value else 0)
            if last is not None:
                heartbeat.add_metric([node_id], last.timestamp())
        yield from (status, heartbeat)

    def _jobs(self) -> Iterator[Metric]:
        waiting = GaugeMetricFamily(
            "shardyard_job_capacity_wait_since_timestamp_seconds",
            "Unix time since which a job has waited for capacity, by its pending reason",
            labels=["job", "reason"],
        )
        progress = GaugeMetricFamily(
            "shardyard_job_last_progress_timestamp_seconds",
            "Unix time of a running job's newest training progress, or of its attempt's start",
            labels=["job"],
        )
        ratio = GaugeMetricFamily(
            "shardyard_job_sync_interval_ratio",
            "A running job's observed steps between parameter syncs over the sync_interval it asked for",
            labels=["job"],
        )
        timeout = GaugeMetricFamily(
            "shardyard_job_sync_timeout_timestamp_seconds",
            "Unix time of a job's newest shard failure by SYNC_TIMEOUT",
            labels=["job"],
        )
        for job in self.view.jobs.values():
            since, last, widened = shortage_since(job), last_progress(job), sync_ratio(job)
            if since is not None:
                waiting.add_metric([job.job_id, str(job.reason)], since.timestamp())
            if job.state is JobState.RUNNING and last is not None:
                progress.add_metric([job.job_id], last.timestamp())
            if job.state is JobState.RUNNING and widened is not None:
                ratio.add_metric([job.job_id], widened)
            if job.sync_timeout is not None:
                timeout.add_metric([job.job_id], job.sync_timeout.occurred_at.timestamp())
        yield from (waiting, progress, ratio, timeout)


def make_registry(view: ClusterView) -> tuple[CollectorRegistry, Counter]:
    registry = CollectorRegistry()
    registry.register(ClusterCollector(view))
    registry.register(AlertCollector(view))
    events = Counter("shardyard_monitor_events", "Events the monitor consumed", labelnames=["topic"], registry=registry)
    return registry, events
