"""The figures of ``bench/scale.py``, from what it recorded: latency percentiles, CPU and rates over the window,
false and true node verdicts, consumer lag, and the summary over runs and sizes."""

import statistics
from typing import Any

from scale_bus import BusWatch, percentile, samples
from shardyard.bus.topics import HEARTBEATS

MIX = ((1, 0.5), (2, 0.3), (8, 0.2))
"""GPUs per job and their share of the stream."""
STAGES = ("accepted", "ready", "scheduled")


def latencies(watch: BusWatch, sent: dict[str, float], gpus: dict[str, int], jobs: list[str]) -> dict[str, Any]:
    """Submission to each stage, by arrival here, of ``jobs`` (``sent``: when each was handed to the producer)."""
    out: dict[str, Any] = {"jobs": len(jobs)}
    for stage in STAGES:
        ms = [(watch.jobs[j][stage] - sent[j]) * 1000 for j in jobs if stage in watch.jobs.get(j, {})]
        out[f"submit_to_{stage}_ms"] = {"p50": percentile(ms, 0.5), "p95": percentile(ms, 0.95)}
        out[f"submit_to_{stage}_ms"] |= {"p99": percentile(ms, 0.99), "max": percentile(ms, 1.0), "count": len(ms)}
    by_event = {}  # the same from the events' own occurred_at: what the reading here adds is the difference
    for stage in STAGES:
        ms = [(watch.occurred[j][stage] - sent[j]) * 1000 for j in jobs if stage in watch.occurred.get(j, {})]
        by_event[f"submit_to_{stage}_ms"] = {"p50": percentile(ms, 0.5), "p99": percentile(ms, 0.99)}
    out["by_occurred_at"] = by_event
    if jobs:
        start = min(sent[j] for j in jobs)
        minutes: dict[int, list[float]] = {}
        for j in jobs:
            if "scheduled" in watch.jobs.get(j, {}):
                minutes.setdefault(int((sent[j] - start) // 60), []).append(
                    (watch.jobs[j]["scheduled"] - sent[j]) * 1000
                )
        out["by_minute"] = {  # submit -> scheduled of the jobs submitted in each minute of the window
            str(m): {"p50": percentile(ms, 0.5), "p99": percentile(ms, 0.99), "count": len(ms)}
            for m, ms in sorted(minutes.items())
        }
    ends = ("succeeded", "failed", "rejected", "unschedulable")
    counts = {k: sum(1 for j in jobs if k in watch.jobs.get(j, {})) for k in ends}
    by_size = {g: [j for j in jobs if gpus[j] == g] for g, _ in MIX}
    scheduled = {g: sum(1 for j in js if "scheduled" in watch.jobs.get(j, {})) for g, js in by_size.items()}
    return out | counts | {"scheduled_by_gpus": {f"{g}/{len(by_size[g])}": n for g, n in scheduled.items()}}


def consumed(text: str | None, topic: str) -> float:
    return sum(v for labels, v in samples(text, "shardyard_events_consumed_total") if labels.get("topic") == topic)


def pool_beats(text: str | None) -> float:
    """Beats a pool replica read: full heartbeats and leases, a relayed record counting each lease it carries."""
    return sum(v for _labels, v in samples(text, "shardyard_pool_beats_total"))


def window_figures(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    elapsed = last["t"] - first["t"]
    cpu = {
        name: round(100 * (last["cpu"][name] - start) / elapsed, 1)
        for name, start in first["cpu"].items()
        if start is not None and last["cpu"].get(name) is not None
    }
    pool = {
        name: round((consumed(last["metrics"][name], HEARTBEATS.name) - consumed(text, HEARTBEATS.name)) / elapsed, 1)
        for name, text in first["metrics"].items()
        if name.startswith("resource-pool")
    }
    beats = {
        name: round((pool_beats(last["metrics"][name]) - pool_beats(text)) / elapsed, 1)
        for name, text in first["metrics"].items()
        if name.startswith("resource-pool")
    }
    return {
        "measured_s": round(elapsed, 1),
        "cpu_percent": cpu,
        "cpu_percent_total": round(sum(cpu.values()), 1),
        "pool_heartbeats_per_s": pool,
        "pool_beats_per_s": beats,
        "node_states_per_s": round((last["node_states"] - first["node_states"]) / elapsed, 1),
    }


def node_faults(watch: BusWatch, victims: dict[str, float], stopped_at: float, w0: float, w1: float) -> dict[str, Any]:
    """False SUSPECT / LOST (a node still heartbeating) in the window and outside it, and each victim's detection."""

    def false(node: str, occurred: float) -> bool:
        return node not in victims or occurred < stopped_at

    found: dict[str, Any] = {}
    events = [(n, s, o, r) for n, s, o, r in watch.not_alive] + [(n, "NODE_LOST", o, r) for n, o, r in watch.lost]
    for status, name in (("SUSPECT", "suspect"), ("LOST", "lost"), ("NODE_LOST", "node_lost")):
        bad = [(n, r) for n, s, o, r in events if s == status and false(n, o)]
        inside = [n for n, r in bad if w0 <= r <= w1]
        found[f"false_{name}"] = len(inside)
        found[f"false_{name}_nodes"] = len(set(inside))
        found[f"false_{name}_outside_window"] = len(bad) - len(inside)
        by_10s: dict[str, int] = {}
        for _n, r in bad:  # when, from the window's start (negative: the warm-up), by 10 s
            at = f"{int((r - w0) // 10) * 10}"
            by_10s[at] = by_10s.get(at, 0) + 1
        found[f"false_{name}_by_10s"] = dict(sorted(by_10s.items(), key=lambda kv: int(kv[0])))
    detection = {}
    for node, last in victims.items():
        mine = {}
        for status, name in (("SUSPECT", "suspect"), ("LOST", "lost"), ("NODE_LOST", "node_lost")):
            hit = next(((o, r) for n, s, o, r in events if n == node and s == status and o >= last), None)
            mine[f"{name}_s"] = round(hit[0] - last, 2) if hit else None
            mine[f"{name}_seen_s"] = round(hit[1] - last, 2) if hit else None
        detection[node] = mine
    return found | {"detection": detection}


def lag_figures(taken: list[dict[str, Any]], error: str | None) -> dict[str, Any]:
    def worst(key: str) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for sample in taken:
            for owner, topics in (sample[key] or {}).items():
                for topic, behind in topics.items():
                    out.setdefault(owner, {})[topic] = max(out.get(owner, {}).get(topic, behind), behind)
        return out

    last = taken[-1] if taken else {"groups": None, "metric": {}}
    source = "admin (committed offsets vs corrected end offsets)" if error is None else f"metric only: {error}"
    metric = {owner: {k: v for k, v in lags.items() if v} for owner, lags in worst("metric").items()}
    return {
        "source": source,
        "samples": len(taken),
        "groups_last": last["groups"],
        "groups_max": worst("groups") if error is None else None,
        "metric_max_nonzero": {owner: lags for owner, lags in metric.items() if lags},
        "metric_note": "each process's shardyard_consumer_lag_messages (group/topic; 'none': no group), max over the"
        " samples, zeros left out; on Tansu uncorrected for its end offsets (may read low or negative)",
    }


def cycle_figures(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """The scheduler leader's cycles over the window (``shardyard_placement_cycle_seconds``): how many, their mean,
    and how many took longer than each bucket bound from 0.1 s (a cycle is the decision alone, not publishing)."""
    out: dict[str, Any] = {}
    for name, text in first["metrics"].items():
        if not name.startswith("scheduler"):
            continue

        def read(source: str | None) -> tuple[float, float, dict[str, float]]:
            count = sum(v for _, v in samples(source, "shardyard_placement_cycle_seconds_count"))
            total = sum(v for _, v in samples(source, "shardyard_placement_cycle_seconds_sum"))
            buckets = {labels["le"]: v for labels, v in samples(source, "shardyard_placement_cycle_seconds_bucket")}
            return count, total, buckets

        c0, s0, b0 = read(text)
        c1, s1, b1 = read(last["metrics"].get(name))
        cycles = c1 - c0
        if cycles <= 0:
            continue
        longer = {f">{le}s": int(cycles - (b1[le] - b0.get(le, 0))) for le in ("0.1", "0.25", "0.5", "1.0", "2.5")}
        out[name] = {"cycles": int(cycles), "mean_s": round((s1 - s0) / cycles, 4), "longer_than": longer}
    return out


def burst_figures(watch: BusWatch, jobs: list[str], t0: float) -> dict[str, Any]:
    out: dict[str, Any] = {"jobs": len(jobs)}
    for stage in ("accepted", "scheduled"):
        times = [watch.jobs[j][stage] for j in jobs if stage in watch.jobs.get(j, {})]
        out[f"{stage}_per_s"] = round(len(times) / (max(times) - t0), 1) if times else None
        out[f"{stage}"] = len(times)
    out["not_scheduled"] = len(jobs) - out["scheduled"]
    # Over the whole burst the rate can be capacity's (the GPUs the burst asks for, spares included, may exceed the
    # cluster's: the last jobs wait for shards to end); how many were in by each time says how fast it went meanwhile.
    for stage in ("accepted", "scheduled"):
        times = sorted(watch.jobs[j][stage] - t0 for j in jobs if stage in watch.jobs.get(j, {}))
        out[f"{stage}_by_s"] = {str(s): sum(1 for t in times if t <= s) for s in (1, 2, 3, 5, 10, 20)}
        if times:
            half = times[len(times) // 2]
            out[f"{stage}_first_half_per_s"] = round((len(times) // 2 + 1) / half, 1) if half > 0 else None
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def med(values: list[Any]) -> float | None:
        present = [v for v in values if v is not None]
        return round(statistics.median(present), 2) if present else None

    sizes: dict[int, dict[str, Any]] = {}
    for n in sorted({r["nodes"] for r in runs}):
        rs = [r for r in runs if r["nodes"] == n and "error" not in r]
        s: dict[str, Any] = {"runs": len(rs), "errors": sum(1 for r in runs if r["nodes"] == n and "error" in r)}
        if not rs:
            sizes[n] = s
            continue
        for stage in STAGES:
            for q in ("p50", "p99"):
                s[f"submit_to_{stage}_ms_{q}"] = med([r["latency"][f"submit_to_{stage}_ms"][q] for r in rs])
        for key in ("false_suspect", "false_lost", "false_node_lost"):
            s[key] = sum(r[key] for r in rs)
        for key in ("suspect_s", "lost_s"):
            s[f"detection_{key}"] = med([d[key] for r in rs for d in r["detection"].values()])
        s["cpu_percent_total"] = med([r["cpu_percent_total"] for r in rs])
        s["cpu_percent"] = {p: med([r["cpu_percent"].get(p) for r in rs]) for p in rs[0]["cpu_percent"]}
        s["pool_heartbeats_per_s"] = {
            p: med([r["pool_heartbeats_per_s"].get(p) for r in rs]) for p in rs[0]["pool_heartbeats_per_s"]
        }
        s["pool_beats_per_s"] = {
            p: med([r.get("pool_beats_per_s", {}).get(p) for r in rs]) for p in rs[0].get("pool_beats_per_s", {})
        }
        s["heartbeats_sent_per_s"] = med([r["heartbeats_sent_per_s"] for r in rs])
        s["beats_sent_per_s"] = med([r.get("beats_sent_per_s") for r in rs])
        s["node_simulator_cpu_ms_per_node_per_s"] = med([r.get("node_simulator_cpu_ms_per_node_per_s") for r in rs])
        rss = [[p["rss_mib"] for p in r.get("broker_over_time", []) if p["rss_mib"] is not None] for r in rs]
        s["broker_rss_mib_first_last"] = [[series[0], series[-1]] for series in rss if series]
        minutes = [r["latency"].get("by_minute", {}) for r in rs]
        s["scheduled_p99_last_vs_first_minute"] = [
            round(m[max(m, key=int)]["p99"] / m["0"]["p99"], 2)
            for m in minutes
            if len(m) >= 2 and m["0"]["p99"] and m[max(m, key=int)]["p99"] is not None
        ]
        s["node_states_per_s"] = med([r["node_states_per_s"] for r in rs])
        lag_max: dict[str, float] = {}
        for r in rs:
            for group, topics in (r["consumer_lag"]["groups_max"] or {}).items():
                lag_max[group] = max(lag_max.get(group, 0), sum(topics.values()))
        s["group_lag_max"] = lag_max
        if "burst" in rs[0]:
            for key in ("accepted_per_s", "scheduled_per_s", "not_scheduled"):
                s[key] = med([r["burst"][key] for r in rs])
        sizes[n] = s
    growth = {}
    base = sizes.get(100, {})
    for n, s in sizes.items():
        for q in ("p50", "p99"):
            b, v = base.get(f"submit_to_scheduled_ms_{q}"), s.get(f"submit_to_scheduled_ms_{q}")
            if b and v is not None and n != 100:
                growth.setdefault(str(n), {})[f"scheduled_{q}_ratio_vs_100"] = round(v / b, 2)
    return {"sizes": {str(n): s for n, s in sizes.items()}, "growth_vs_100": growth or None}
