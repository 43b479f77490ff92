"""What a person reads off the monitor's ``/metrics`` for S7 (job state, resource use, network latency; step, loss,
GPU/CPU use, data-transfer rate, AllReduce time, node health), as one table the end-to-end tests check."""

from prometheus_client.parser import text_string_to_metric_families

S7_METRICS = {
    # S7 item -> (metric family, labels a sample must carry; "{job}" stands for the running job's id)
    "job state": ("shardyard_jobs", {"state": "RUNNING"}),
    "training step": ("shardyard_shard_step", {"job": "{job}"}),
    "loss": ("shardyard_shard_loss", {"job": "{job}"}),
    "GPU utilisation": ("shardyard_gpu_utilization_ratio", {}),
    "GPU memory (resource use)": ("shardyard_gpu_memory_used_bytes", {}),
    "CPU utilisation": ("shardyard_shard_cpu_ratio", {"job": "{job}"}),
    "node CPU load": ("shardyard_node_cpu_load_ratio", {}),
    "data-transfer rate (bytes)": ("shardyard_allreduce_bytes", {"job": "{job}"}),
    "data-transfer rate (seconds)": ("shardyard_allreduce_seconds", {"job": "{job}"}),
    "AllReduce time": ("shardyard_allreduce_last_seconds", {"job": "{job}"}),
    "network latency": ("shardyard_node_mean_rtt_seconds", {}),
    "node health": ("shardyard_node_status", {"status": "ALIVE"}),
    "throughput": ("shardyard_shard_samples_per_second", {"job": "{job}"}),
}


def missing_s7_metrics(exposition: str, job_id: str) -> list[str]:
    """The S7 items of ``S7_METRICS`` that no sample of the Prometheus text ``exposition`` shows for ``job_id``."""
    samples = [s for family in text_string_to_metric_families(exposition) for s in family.samples]
    missing = []
    for item, (name, wanted) in S7_METRICS.items():
        labels = {k: v.replace("{job}", job_id) for k, v in wanted.items()}
        if not any(
            s.name.removesuffix("_total") == name and all(s.labels.get(k) == v for k, v in labels.items())
            for s in samples
        ):
            missing.append(f"{item}: {name}{labels}")
    return missing
