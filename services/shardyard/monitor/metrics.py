"""Prometheus metrics of the monitor, computed at scrape time from the cluster view."""

from collections import Counter as Tally
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shardyard.events import NodeStatus
from shardyard.lifecycle import JobState
from shardyard.monitor.views import ClusterView

QUEUED = frozenset({JobState.ACCEPTED, JobState.WAITING, JobState.READY})
"""Jobs not placed yet: held by the queue, or ready and waiting for the scheduler."""
NO_REASON = "NONE"


class ClusterCollector(Collector):
    def __init__(self, view: ClusterView) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        view = self.view
        jobs = GaugeMetricFamily("shardyard_jobs", "Jobs by lifecycle state", labels=["state"])
        for state, count in view.counts().items():
            jobs.add_metric([state], count)
        yield jobs
        yield self._queue()
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

        nodes = GaugeMetricFamily("shardyard_nodes", "Nodes by liveness status", labels=["status"])
        for status in NodeStatus:
            nodes.add_metric([status.value], sum(1 for n in view.nodes.values() if n.status is status))
        yield nodes
        draining = GaugeMetricFamily("shardyard_nodes_draining", "Nodes drained by an operator (no new shards)")
        draining.add_metric([], sum(1 for n in view.nodes.values() if n.draining))
        yield draining

        util = GaugeMetricFamily(
            "shardyard_gpu_utilization_ratio", "GPU utilisation, 0..1", labels=["node", "gpu", "model", "simulated"]
        )
        memory = GaugeMetricFamily("shardyard_gpu_memory_used_bytes", "GPU memory in use", labels=["node", "gpu"])
        temperature = GaugeMetricFamily("shardyard_gpu_temperature_celsius", "GPU temperature", labels=["node", "gpu"])
        load = GaugeMetricFamily("shardyard_node_cpu_load_ratio", "Node CPU load, 0..1", labels=["node"])
        for node in view.nodes.values():
            load.add_metric([node.node_id], node.cpu_load)
            for gpu in node.gpus:
                labels = [node.node_id, str(gpu.index)]
                util.add_metric([*labels, gpu.model, str(gpu.simulated).lower()], gpu.utilization)
                memory.add_metric(labels, gpu.memory_used_bytes)
                if gpu.temperature_c is not None:
                    temperature.add_metric(labels, gpu.temperature_c)
        yield from (util, memory, temperature, load)

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
        for job in view.jobs.values():
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


def make_registry(view: ClusterView) -> tuple[CollectorRegistry, Counter]:
    registry = CollectorRegistry()
    registry.register(ClusterCollector(view))
    events = Counter("shardyard_monitor_events", "Events the monitor consumed", labelnames=["topic"], registry=registry)
    return registry, events
