"""Listings for the terminal: ``shardyard jobs`` and ``shardyard nodes`` as tables (``wide``: more columns), the wide
alerts, and ``shardyard status``'s summary of the cluster. Pure functions of the monitor's JSON and the time now."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from shardyard.cli.render import TERMINAL, alert_history, alerts_report, duration, firing_table, fmt, gpu_kinds
from shardyard.cli.start_estimate import start_estimate
from shardyard.text_table import table
from shardyard.units import format_bytes


def _at(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _clock(value: str | None) -> str:
    """``2026-01-01T00:00:05Z``: a time of the monitor's JSON, to the second, in UTC."""
    at = _at(value)
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if at else "-"


# --- jobs -----------------------------------------------------------------------------------------------------------
def elapsed(job: dict[str, Any], now: datetime) -> str:
    """ELAPSED: the time since the job was submitted, across its attempts (a retry does not reset it); an ended
    job's from its submission to its end; ``-`` when the view does not say when it was submitted. (``-o wide`` adds
    when it was submitted and when its current attempt started.)"""
    ended, submitted = _at(job.get("ended_at")), _at(job.get("submitted_at"))
    if submitted is None:
        return "-"
    if job["state"] in TERMINAL:
        return duration((ended - submitted).total_seconds()) if ended else "-"
    return duration((now - submitted).total_seconds())


def _reason(job: dict[str, Any]) -> str:
    return (f"{job['reason']}: " if job.get("reason") else "") + (job.get("message") or "")


JOB_COLUMNS = ["JOB", "STATE", "OWNER", "QUEUE", "PRIO", "GPUS", "STEP", "LOSS", "ELAPSED", "REASON"]
WIDE_JOB_COLUMNS = [*JOB_COLUMNS[:6], "ATTEMPT", "STEP", "LOSS", "SUBMITTED", "STARTED", "ELAPSED", "STARTS", "REASON"]


def jobs_table(jobs: list[dict[str, Any]], now: datetime, *, wide: bool = False) -> str:
    """``shardyard jobs``: one row per job, in the monitor's order; ``wide`` adds the attempt, when the job was
    submitted and (last) started, and, waiting on capacity, when it is expected to start (``~12m (90%: 30m)``)."""
    rows = []
    for j in jobs:
        first = [j["job_id"], str(j["state"]), fmt(j.get("owner")), fmt(j.get("queue"))]
        first += [fmt(j.get("priority")), fmt(j.get("gpus"))]
        progress = [f"{j.get('step', 0)}/{fmt(j.get('max_steps'))}", fmt(j.get("loss"))]
        if wide:
            when = [_clock(j.get("submitted_at")), _clock(j.get("started_at"))]
            starts = start_estimate(j, now, short=True) or "-"
            rows.append([*first, fmt(j.get("attempt")), *progress, *when, elapsed(j, now), starts, _reason(j)])
        else:
            rows.append([*first, *progress, elapsed(j, now), _reason(j)])
    return table(rows, WIDE_JOB_COLUMNS if wide else JOB_COLUMNS)


# --- nodes ----------------------------------------------------------------------------------------------------------
def _gpu_use(gpus: list[dict[str, Any]]) -> list[str]:
    """Mean utilisation, memory used/total and the hottest temperature of a node's GPUs."""
    if not gpus:
        return ["-", "-", "-"]
    utilization = sum(g.get("utilization", 0.0) for g in gpus) / len(gpus)
    used = sum(g.get("memory_used_bytes", 0) for g in gpus)
    total = sum(g.get("memory_bytes", 0) for g in gpus)
    temperatures = [g["temperature_c"] for g in gpus if g.get("temperature_c") is not None]
    memory = f"{format_bytes(used)}/{format_bytes(total)}"
    return [f"{utilization:.0%}", memory, f"{max(temperatures):.0f}C" if temperatures else "-"]


def _host(node: dict[str, Any], now: datetime) -> list[str]:
    """CPU cores, memory, the output disk's free space, artifacts present, topology labels, and how long since its
    newest sign of life."""
    disk = node.get("output_disk")
    seen = _at(node.get("last_heartbeat_at"))
    return [
        fmt(node.get("cpu_cores")),
        format_bytes(node["memory_bytes"]) if node.get("memory_bytes") is not None else "-",
        f"{format_bytes(disk['free_bytes'])}/{format_bytes(disk['total_bytes'])}" if disk else "-",
        fmt(node.get("artifact_count")),
        ",".join(f"{k}={v}" for k, v in sorted((node.get("topology") or {}).items())) or "-",
        f"{duration((now - seen).total_seconds())} ago" if seen else "-",
    ]


NODE_COLUMNS = ["NODE", "STATUS", "GPUS", "IN USE", "LOAD", "SHARDS"]
WIDE_NODE_COLUMNS = [*NODE_COLUMNS[:4], "GPU UTIL", "GPU MEM", "TEMP", "LOAD", "CPUS", "MEMORY", "DISK FREE"]
WIDE_NODE_COLUMNS += ["ARTIFACTS", "TOPOLOGY", "SEEN", "SHARDS"]


def nodes_table(nodes: list[dict[str, Any]], now: datetime, *, wide: bool = False) -> str:
    """``shardyard nodes``; ``wide`` adds the GPUs' use, the host's cores, memory and disk, its artifacts and
    topology labels, and how long ago it was last heard from."""
    rows = []
    for n in nodes:
        simulated = " (simulated)" if any(g.get("simulated") for g in n["gpus"]) else ""
        first = [
            n["node_id"],
            str(n["status"]) + (" DRAIN" if n.get("draining") else ""),
            (gpu_kinds(n["gpus"]) or "-") + simulated,
            f"{len(n['allocated_gpus'])}/{len(n['gpus'])}",
        ]
        load, shards = f"{n['cpu_load']:.0%}", ", ".join(f"{r['job_id']}#{r['shard_index']}" for r in n["running"])
        if wide:
            rows.append([*first, *_gpu_use(n["gpus"]), load, *_host(n, now), shards or "-"])
        else:
            rows.append([*first, load, shards or "-"])
    return table(rows, WIDE_NODE_COLUMNS if wide else NODE_COLUMNS)


# --- alerts ---------------------------------------------------------------------------------------------------------
def alerts_table(answer: dict[str, Any], now: datetime, *, wide: bool = False) -> str:
    """``shardyard alerts``; ``wide`` adds each alert's measure, its limit and when it began."""
    if not wide:
        return alerts_report(answer, now)
    firing, recent = answer.get("firing") or [], answer.get("recent") or []
    rows = [
        [
            a["severity"],
            a["rule"],
            a["subject"],
            fmt(a.get("value")),
            fmt(a.get("threshold")),
            _clock(a["since"]),
            duration((now - datetime.fromisoformat(a["since"])).total_seconds()),
            a["summary"],
        ]
        for a in firing
    ]
    headers = ["SEVERITY", "RULE", "SUBJECT", "VALUE", "THRESHOLD", "SINCE", "FOR", "SUMMARY"]
    shown = table(rows, headers) if firing else firing_table(firing, now)
    return "\n".join([f"firing ({len(firing)}):", shown, "", "recent:", alert_history(recent)])


# --- `shardyard status`: the cluster at a glance ------------------------------------------------------------------
def _counts(counts: dict[str, int]) -> str:
    """``2 RUNNING, 1 READY``: the non-zero counts, in the monitor's order."""
    return ", ".join(f"{n} {what}" for what, n in counts.items() if n) or "none"


def _leader(leaders: dict[str, dict[str, Any]], service: str) -> str:
    found = leaders.get(service)
    if found is None:
        return "not known to the monitor (no election seen yet)"
    return f"{found['instance']} (term {found['term']}, since {_clock(found.get('since'))})"


def _gpu_lines(summary: dict[str, Any]) -> list[str]:
    """The GPUs of the nodes not LOST: in use, free (what a new job could be given now) and faulty, then per model.
    An older monitor's summary has totals only (LOST nodes' GPUs among them)."""
    models: dict[str, dict[str, int]] | None = summary.get("gpu_models")
    if models is None:
        return [f"GPUs:    {summary.get('gpus_allocated', 0)} of {summary.get('gpus', 0)} in use"]
    total = {what: sum(m[what] for m in models.values()) for what in ("gpus", "allocated", "free", "unhealthy")}
    line = f"GPUs:    {total['allocated']} of {total['gpus']} in use, {total['free']} free"
    line += f", {total['unhealthy']} faulty" if total["unhealthy"] else ""
    rows = [
        [model, *(str(m[what]) for what in ("gpus", "allocated", "free", "unhealthy"))] for model, m in models.items()
    ]
    if not rows:
        return [line]
    indented = ["  " + row for row in table(rows, ["MODEL", "GPUS", "IN USE", "FREE", "FAULTY"]).splitlines()]
    return [line, *indented]


def cluster_summary(summary: dict[str, Any], monitor_url: str, *, wide: bool = False) -> str:
    """``shardyard status``: what ``/api/summary`` says, one line per subject, with the GPUs per model; ``wide``
    adds every service's leader, GPU utilisation and the cluster's counters."""
    nodes = _counts(summary.get("nodes") or {})
    draining = f"; {summary['draining']} draining" if summary.get("draining") else ""
    jobs = summary.get("jobs") or {}
    firing: dict[str, int] = summary.get("alerts_firing") or {}
    leaders: dict[str, dict[str, Any]] = summary.get("leaders") or {}
    lines = [
        f"monitor: {monitor_url}",
        f"scheduler leader: {_leader(leaders, 'scheduler')}",
        f"nodes:   {nodes if nodes != 'none' else 'none have reported'}{draining}",
        *_gpu_lines(summary),
        f"jobs:    {_counts(jobs)} ({summary.get('active_jobs', 0)} active of {sum(jobs.values())})",
    ]
    if "alerts_firing" in summary:
        total = sum(firing.values())
        lines.append(f"alerts:  {total} firing" + (f": {_counts(firing)} (`shardyard alerts`)" if total else ""))
    if wide:
        lines += _wide_lines(summary, leaders)
    return "\n".join(lines)


def _wide_lines(summary: dict[str, Any], leaders: dict[str, dict[str, Any]]) -> list[str]:
    utilization = summary.get("gpu_utilization")
    counters = ("preemptions", "recoveries", "cancellations", "dead_letters")
    return [
        f"GPU utilisation: {'-' if utilization is None else f'{utilization:.0%}'}",
        f"spare ratio: {fmt(summary.get('spare_ratio'))}, shard failure rate: {fmt(summary.get('failure_rate'))}",
        ", ".join(f"{name.replace('_', ' ')}: {summary.get(name, 0)}" for name in counters),
        "leaders:",
        *(f"  {service}: {_leader(leaders, service)}" for service in leaders),
        *(["  (none seen)"] if not leaders else []),
    ]
