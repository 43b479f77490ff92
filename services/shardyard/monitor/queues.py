"""The teams' queues as the monitor shows them: per queue and GPU model, the nominal quota and the GPUs used,
borrowed and lent; the jobs and GPUs pending; the fair share; and since when the queue waits for its nominal quota
(``QUEUE_STARVED``). Pure: the view's jobs and nodes and the configuration in force in, JSON-ready rows out.

The figures are the scheduler's (``shardyard.quotas``): the same ledger, fed with the gangs placed now (SCHEDULED or
RUNNING, spares included) on the models of the nodes they hold, so ``shardyard queues`` reads what placement counts.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shardyard.events import NodeState, NodeStatus, QueuesConfigured
from shardyard.gpus import DEFAULT_TFLOPS
from shardyard.lifecycle import JobState
from shardyard.monitor.jobs import JobView
from shardyard.quotas import DEFAULT_QUEUE, Ledger, QueuesConfig, QueueSpec, dominant_share

PLACED = frozenset({JobState.SCHEDULED, JobState.RUNNING})
WAITING = frozenset({JobState.ACCEPTED, JobState.WAITING, JobState.READY})
ANY_MODEL = "any"
"""The model label of pending GPUs of jobs that name none."""


@dataclass
class QueueRow:
    queue: str
    models: dict[str, dict[str, int]] = field(default_factory=dict)
    pending_jobs: int = 0
    running_jobs: int = 0
    fair_share: float = 0.0
    starving_since: datetime | None = None
    """Since when the queue's oldest READY job that fits in its nominal quota has waited with a pending reason."""

    def json(self, spec: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "queue": self.queue,
            **(spec or {}),
            "models": self.models,
            "pending_jobs": self.pending_jobs,
            "running_jobs": self.running_jobs,
            "fair_share": round(self.fair_share, 6),
            "starving_since": self.starving_since.isoformat() if self.starving_since else None,
        }


@dataclass(frozen=True)
class Capacity:
    """The live nodes' GPUs per model, their TFLOPS, CPU and memory: what shares are of."""

    gpus: dict[str, int]
    tflops: dict[str, float]
    model_of: dict[str, str]
    cpu: float
    memory: int

    @classmethod
    def of(cls, nodes: Iterable[NodeState]) -> "Capacity":
        gpus: dict[str, int] = {}
        tflops: dict[str, float] = {}
        model_of: dict[str, str] = {}
        cpu, memory = 0.0, 0
        for node in nodes:
            if not node.gpus:
                continue
            model = node.gpus[0].model
            model_of[node.node_id] = model
            if node.status is NodeStatus.LOST:
                continue
            gpus[model] = gpus.get(model, 0) + len(node.gpus)
            tflops.setdefault(model, DEFAULT_TFLOPS.get(model, node.gpus[0].tflops))
            cpu += node.cpu_cores
            memory += node.memory_bytes
        return cls(gpus, tflops, model_of, cpu, memory)


def _held(job: JobView, model_of: Mapping[str, str]) -> dict[str, int]:
    held: dict[str, int] = {}
    for placement in job.placements:
        model = model_of.get(placement["node_id"], placement.get("gpu_model", ""))
        held[model] = held.get(model, 0) + len(placement["gpu_indices"])
    return held


def queue_rows(
    configured: QueuesConfigured | None, jobs: Iterable[JobView], nodes: Iterable[NodeState]
) -> dict[str, QueueRow]:
    """Every queue's row: those configured, and any a job names (a queue no file configures has no quota)."""
    config = configured.config if configured is not None else QueuesConfig(queues={DEFAULT_QUEUE: QueueSpec()})
    capacity = Capacity.of(nodes)
    ledger = Ledger(config)
    rows = {name: QueueRow(name) for name in config.queues}
    ready: list[tuple[JobView, str]] = []
    for job in jobs:
        if (job.state not in PLACED and job.state not in WAITING) or job.spec is None:
            continue
        queue = str(job.spec.get("queue") or DEFAULT_QUEUE)
        row = rows.setdefault(queue, QueueRow(queue))
        if job.state in PLACED:
            row.running_jobs += 1
            for model, gpus in _held(job, capacity.model_of).items():
                ledger.add(queue, model, gpus)
            ledger.add_resources(queue, float(job.spec.get("cpu_cores", 0)), int(job.spec.get("memory_bytes", 0)))
            continue
        row.pending_jobs += 1
        wanted = str(job.spec.get("gpu_model") or ANY_MODEL)
        pending = row.models.setdefault(wanted, {}).setdefault("pending", 0)
        row.models[wanted]["pending"] = pending + int(job.spec.get("gpu_count", 0))
        if job.state is JobState.READY:
            ready.append((job, queue))
    models = sorted({*capacity.gpus, *config.models(), *(m for r in rows.values() for m in r.models if m != ANY_MODEL)})
    for name, row in rows.items():
        for model in models:
            use = ledger.use(name, model)
            figures = {"nominal": use.nominal, "used": use.used, "borrowed": use.borrowed, "lent": use.lent}
            if any(figures.values()) or model in row.models:
                row.models[model] = {**figures, "pending": row.models.get(model, {}).get("pending", 0)}
        row.models = dict(sorted(row.models.items()))
        row.fair_share = dominant_share(ledger, name, capacity.gpus, capacity.tflops, capacity.cpu, capacity.memory)
    _starving(ready, rows, ledger, models)
    return dict(sorted(rows.items()))


def _starving(ready: list[tuple[JobView, str]], rows: dict[str, QueueRow], ledger: Ledger, models: list[str]) -> None:
    """Mark each queue whose READY job would fit in its nominal quota (with what the queue holds now) and is not
    placed, since the earliest such job's pending reason (a job the scheduler gave none yet is not waiting)."""
    for job, queue in ready:
        spec = job.spec or {}
        need = int(spec.get("gpu_count", 0))
        usable = [spec["gpu_model"]] if spec.get("gpu_model") and spec.get("min_match") is None else models
        if not any(ledger.holds(queue, m) + need <= ledger.nominal(queue, m) for m in usable):
            continue
        since, row = job.reason_since, rows[queue]
        if since is not None and (row.starving_since is None or since < row.starving_since):
            row.starving_since = since


def queues_json(configured: QueuesConfigured | None, rows: Mapping[str, QueueRow]) -> dict[str, Any]:
    """``/api/queues``: the rows, and the configuration they were judged by (its version, file and knobs)."""
    specs = {}
    if configured is not None:
        specs = {name: _spec_json(configured.config, name) for name in configured.config.queues}
    return {
        "configured": configured is not None,
        "version": configured.version if configured else None,
        "source": configured.source if configured else None,
        "configured_at": configured.occurred_at.isoformat() if configured else None,
        "min_runtime_s": configured.config.min_runtime_s if configured else None,
        "starving_after_s": configured.config.starving_after_s if configured else None,
        "queues": [row.json(specs.get(name)) for name, row in rows.items()],
    }


def _spec_json(config: QueuesConfig, name: str) -> dict[str, Any]:
    spec = config.queues[name]
    return {"cohort": spec.cohort, "weight": spec.weight, "cpu": spec.cpu, "memory": spec.memory}
