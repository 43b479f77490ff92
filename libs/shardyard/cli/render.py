"""Plain-text rendering of jobs, nodes and timelines for the terminal."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from shardyard.cli.artifact_hint import artifact_hint
from shardyard.cli.start_estimate import start_estimate
from shardyard.text_table import table

if TYPE_CHECKING:
    from shardyard.admission import Refused


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def gpu_kinds(gpus: list[dict[str, Any]]) -> str:
    """``2xA100 35TF, 1xV100 14.2TF*``: count, model and TFLOPS per kind; ``*`` marks a measured figure."""
    kinds: dict[tuple[str, float, bool], int] = {}
    for gpu in gpus:
        kind = (gpu["model"], gpu.get("tflops", 0.0), gpu.get("tflops_source") == "measured")
        kinds[kind] = kinds.get(kind, 0) + 1
    return ", ".join(
        f"{count}x{model} {tflops:g}TF{'*' if measured else ''}" for (model, tflops, measured), count in kinds.items()
    )


def excluded_nodes(node_counts: dict[str, int]) -> str:
    """``0/40 nodes: 25 GPU model mismatch, 10 insufficient free GPUs, 5 load above 50%``: the scheduler's filters
    that excluded nodes, most first. Each node counts under the first filter it failed, so they add up to all."""
    ranked = sorted(node_counts.items(), key=lambda item: (-item[1], item[0]))
    return f"0/{sum(node_counts.values())} nodes: " + ", ".join(f"{count} {why}" for why, count in ranked)


def _placement(placement: dict[str, Any]) -> str:
    line = (
        f"  shard {placement['shard_index']} placed on {placement['node_id']} GPU "
        f"{','.join(str(g) for g in placement['gpu_indices'])} ({placement['gpu_model']})"
    )
    if placement.get("degraded"):
        line += f" degraded (match {placement['match_score']:.2f})"
    return line


def job_detail(job: dict[str, Any], now: datetime) -> str:
    """``shardyard status JOB``: the job's state, why it waits (and, waiting on capacity, when it is expected to
    start, counted from ``now``), what it needs, where its shards run and how far they got."""
    lines = [f"job {job['job_id']}: {job['state']}"]
    if job.get("queue") or job.get("owner"):
        lines.append(f"  queue: {job.get('queue') or '-'}" + (f", owner {job['owner']}" if job.get("owner") else ""))
    if job.get("reason") or job.get("message"):
        lines.append(f"  reason: {job.get('reason') or '-'}: {job.get('message') or ''}")
    if job.get("node_counts"):
        lines.append(f"    {excluded_nodes(job['node_counts'])}")
    if job.get("estimated_start"):
        lines.append(f"    {start_estimate(job, now)}")
    if job.get("missing_artifacts"):
        lines.extend(artifact_hint(job))
    elif job.get("waiting_for"):
        lines.append(f"    waiting for: {', '.join(job['waiting_for'])}")
    for error in job.get("errors") or []:
        lines.append(
            f"    - {error['field']}: {error['problem']}" + (f" (got {error['input']})" if error["input"] else "")
        )
    if job.get("spec"):
        spec = job["spec"]
        lines.append(
            f"  needs {spec['gpu_count']} x {spec['gpu_model'] or 'any GPU'} >= {spec['min_tflops']:g} TFLOPS, "
            f"{spec['shard_count']} shards, sync every {spec['sync_interval']} steps, {spec['max_steps']} steps"
        )
    if job.get("placements"):
        if job.get("degraded"):
            lines.append("  placed degraded: below a full GPU match, as the job allowed")
        lines.extend(_placement(p) for p in job["placements"])
    if job.get("resume_from"):
        lines.append(f"  resumed from {job['resume_from']}")
    for index, shard in (job.get("shards") or {}).items():
        lines.append(
            f"  shard {index} on {shard['node_id']}: {shard['state']} step {shard.get('step', 0)} "
            f"loss {fmt(shard.get('loss'))} syncs {shard.get('syncs', 0)} "
            f"allreduce {fmt(shard.get('allreduce_ms'))} ms"
        )
    if job.get("first_loss") is not None:
        lines.append(_loss_line(job))
    if job.get("checkpoint_dir"):
        lines.append(f"  checkpoint: {job['checkpoint_dir']}")
    return "\n".join(lines)


def _loss_line(job: dict[str, Any]) -> str:
    """From rank 0's first report to the job's final loss (rank 0's loss at its last step, as ``job.succeeded``
    carries it) once it succeeded, else to rank 0's latest report."""
    first = f"  loss: first {fmt(job['first_loss'])} -> "
    if job.get("final_loss") is not None:
        return first + f"final {fmt(job['final_loss'])} (rank 0's at its last step)"
    return first + f"latest {fmt(job.get('loss'))}"


def timeline(job: dict[str, Any]) -> str:
    entries = job.get("timeline") or []
    if not entries:
        return "  (no events)"
    start = datetime.fromisoformat(entries[0]["at"])
    return "\n".join(
        f"  +{(datetime.fromisoformat(e['at']) - start).total_seconds():7.2f}s  {e['event']:<18} {e['detail']}"
        for e in entries
    )


def loss_curve(job: dict[str, Any], width: int = 40) -> str:
    points = job.get("loss_curve") or []
    if not points:
        return "  (no loss reported)"
    high = max(loss for _, loss in points)
    low = min(loss for _, loss in points)
    span = (high - low) or 1.0
    step = max(1, len(points) // 12)
    chosen = points[::step] + ([points[-1]] if points[-1] not in points[::step] else [])
    return "\n".join(
        f"  step {s:>6}  loss {fmt(loss):>7}  {'#' * max(1, int((loss - low) / span * width))}" for s, loss in chosen
    )


# --- alerts and `shardyard top` ------------------------------------------------------------------------------------
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"})


def duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``2h01m``: how long, at a glance."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _since(alert: dict[str, Any], now: datetime) -> str:
    return duration((now - datetime.fromisoformat(alert["since"])).total_seconds())


def firing_table(firing: list[dict[str, Any]], now: datetime) -> str:
    """Alerts firing now, longest-firing first (the order the monitor gives)."""
    if not firing:
        return "  (no alerts firing)"
    rows = [[a["severity"], a["rule"], a["subject"], _since(a, now), a["summary"]] for a in firing]
    return table(rows, ["SEVERITY", "RULE", "SUBJECT", "FOR", "SUMMARY"])


def alert_history(recent: list[dict[str, Any]]) -> str:
    """Transitions, newest first: when, FIRING or RESOLVED, which alert, and what it said."""
    if not recent:
        return "  (no alerts yet)"
    rows = [
        [
            datetime.fromisoformat(e["occurred_at"]).strftime("%H:%M:%S"),
            "FIRING" if e["type"] == "alert.firing" else "RESOLVED",
            e["rule"],
            e["subject"],
            e["summary"],
        ]
        for e in recent
    ]
    return table(rows, ["AT", "EVENT", "RULE", "SUBJECT", "SUMMARY"])


def alerts_report(answer: dict[str, Any], now: datetime) -> str:
    """``shardyard alerts``: what fires now, then the recent history."""
    firing, recent = answer.get("firing") or [], answer.get("recent") or []
    return "\n".join([f"firing ({len(firing)}):", firing_table(firing, now), "", "recent:", alert_history(recent)])


def _top_nodes(nodes: list[dict[str, Any]]) -> str:
    rows = []
    for n in nodes:
        gpus = n["gpus"]
        temperatures = [g["temperature_c"] for g in gpus if g.get("temperature_c") is not None]
        utilization = sum(g.get("utilization", 0.0) for g in gpus) / len(gpus) if gpus else None
        rows.append(
            [
                n["node_id"],
                str(n["status"]) + (" DRAIN" if n.get("draining") else ""),
                gpu_kinds(gpus) or "-",
                f"{len(n['allocated_gpus'])}/{len(gpus)}",
                "-" if utilization is None else f"{utilization:.0%}",
                f"{n['cpu_load']:.0%}",
                f"{max(temperatures):.0f}C" if temperatures else "-",
            ]
        )
    return table(rows, ["NODE", "STATUS", "GPUS", "IN USE", "GPU UTIL", "LOAD", "TEMP"])


def _top_jobs(jobs: list[dict[str, Any]], limit: int) -> str:
    """Jobs that have not ended first (newest submission first within each group), at most ``limit`` rows."""
    ordered = sorted(jobs, key=lambda j: (j["state"] in TERMINAL, -_submitted(j)))
    rows = [
        [
            j["job_id"],
            str(j["state"]),
            f"{j['step']}/{fmt(j['max_steps'])}",
            fmt(j["loss"]),
            (f"{j['reason']}: " if j["reason"] else "") + (j["message"] or ""),
        ]
        for j in ordered[:limit]
    ]
    text = table(rows, ["JOB", "STATE", "STEP", "LOSS", "REASON"])
    return text + (f"\n  ... {len(ordered) - limit} more (shardyard jobs)" if len(ordered) > limit else "")


def _submitted(job: dict[str, Any]) -> float:
    at = job.get("submitted_at")
    return datetime.fromisoformat(at).timestamp() if at else 0.0


def top(
    nodes: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    firing: list[dict[str, Any]],
    now: datetime,
    *,
    max_jobs: int = 20,
) -> str:
    """One frame of ``shardyard top``: a header line, then nodes, jobs and the alerts firing."""
    alive = sum(1 for n in nodes if n["status"] == "ALIVE")
    running = sum(1 for j in jobs if j["state"] == "RUNNING")
    header = (
        f"shardyard top  {now.strftime('%Y-%m-%d %H:%M:%S %Z')}  nodes {alive}/{len(nodes)} alive  "
        f"jobs {running} running / {len(jobs)}  alerts {len(firing)} firing"
    )
    return "\n".join(
        [
            header,
            "",
            _top_nodes(nodes) if nodes else "  (no nodes have reported)",
            "",
            _top_jobs(jobs, max_jobs) if jobs else "  (no jobs)",
            "",
            "alerts:",
            firing_table(firing, now),
        ]
    )


def log_line(shard: int, attempt: int, line: str, *, prefixed: bool) -> str:
    """A shard log's line; with several logs interleaved, prefixed with whose it is."""
    return f"[shard {shard} attempt {attempt}] {line}" if prefixed else line


# --- measured links (`shardyard nodes --links`) -------------------------------------------------------------------
MATRIX_NODES = 16
"""Up to this many live nodes the links are drawn as an RTT matrix; beyond it, the worst ones as a table."""
WORST_LINKS = 20
SLOW_MARK = "*"


def _ms(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _bandwidth(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.1f} MB/s"


def links_report(answer: dict[str, Any], *, wide: bool = False) -> str:
    """What ``/api/links`` says (measured links only, worst first): an RTT matrix of the live nodes when there are
    at most ``MATRIX_NODES``, else the ``WORST_LINKS`` worst links; slow links are marked and listed with why.
    ``wide``: every measured link the monitor gave as a table (RTT, p90, bandwidth, when measured), matrix or not."""
    nodes: list[str] = answer.get("nodes") or []
    measured = [link for link in answer.get("links") or [] if link["source"] == "measured"]
    if not measured:
        return f"no link measured among the {len(nodes)} live nodes yet"
    if wide:
        body = worst_links(measured, len(nodes), limit=len(measured))
    else:
        body = rtt_matrix(nodes, measured) if len(nodes) <= MATRIX_NODES else worst_links(measured, len(nodes))
    slow = [link for link in measured if link["slow"]]
    if not slow:
        return body + "\n\nno slow link"
    lines = [f"  {link['a']}|{link['b']}: {link['why']}" for link in slow[:WORST_LINKS]]
    more = [f"  ... {len(slow) - WORST_LINKS} more"] if len(slow) > WORST_LINKS else []
    title = f"{SLOW_MARK} slow links ({len(slow)}), out of line with the cluster's:"
    return "\n".join([body, "", title, *lines, *more])


def rtt_matrix(nodes: list[str], measured: list[dict[str, Any]]) -> str:
    """RTTs in ms between each two nodes (columns numbered as the rows), ``-`` where unmeasured."""
    cells = {(link["a"], link["b"]): _ms(link["rtt_ms"]) + (SLOW_MARK if link["slow"] else "") for link in measured}
    cells |= {(b, a): cell for (a, b), cell in cells.items()}
    axis = sorted({*nodes, *(end for link in measured for end in (link["a"], link["b"]))})
    rows = [[str(i), a, *("" if a == b else cells.get((a, b), "-") for b in axis)] for i, a in enumerate(axis, start=1)]
    return "RTT (ms)\n" + _trimmed(table(rows, ["#", "NODE", *(str(i) for i in range(1, len(axis) + 1))]))


def worst_links(measured: list[dict[str, Any]], live: int, *, limit: int = WORST_LINKS) -> str:
    """The worst ``limit`` links, as the monitor orders them (slow first, then by RTT)."""
    rows = [
        [
            link["a"],
            link["b"],
            _ms(link["rtt_ms"]),
            _ms(link["rtt_p90_ms"]),
            _bandwidth(link["bandwidth_bytes_per_s"]),
            datetime.fromisoformat(link["measured_at"]).strftime("%H:%M:%S"),
            SLOW_MARK if link["slow"] else "",
        ]
        for link in measured[:limit]
    ]
    header = f"the {len(rows)} worst of {len(measured)} measured links among {live} live nodes"
    if len(rows) == len(measured):
        header = f"the {len(rows)} measured links among {live} live nodes, worst first"
    return header + "\n" + _trimmed(table(rows, ["A", "B", "RTT MS", "P90 MS", "BANDWIDTH", "MEASURED", "SLOW"]))


def _trimmed(text: str) -> str:
    """Without the padding that ends a table's lines (its last column is mostly blank here)."""
    return "\n".join(line.rstrip() for line in text.splitlines())


def refusal(refused: Refused) -> str:
    """Why ``submit`` produced nothing: the rejection the queue would give, with each field's error."""
    lines = [f"not submitted: {refused.job_id} would be REJECTED {refused.reason.value}: {refused.message}"]
    lines += [f"  {error.field}: {error.problem}" for error in refused.errors]
    return "\n".join(lines)
