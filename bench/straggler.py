"""Stragglers on a local cluster (issue 36; prints JSON): one shard of a 4-shard job slowed to half speed, found and
swapped out; a slow link and an imbalanced job, found and not swapped (no node is to blame); then healthy jobs on a
loaded machine, where nothing may be swapped.

``swap``: ``shardyard up`` with five A100:1 nodes; a 4-shard job (gradient averaging, every step a sync) trains.
Once it has trained ``--warm-s`` at 4, rank 2's node is slowed to half speed: the test-only
hook of ``shardyard.training.slowdown`` (the own part of each step of a shard there lasts twice as long, as on a GPU
of half the speed; the agents pass ``SHARDYARD_TEST_SLOWDOWN_DIR`` on to the shards). Measured from that moment:

- ``detect_s``: until the fault manager's ``job.straggling`` (its time);
- ``replace_s``: until every shard of the re-formed gang (attempt 2) reported a step (the job's detail, polled);
- ``throughput_recovered``: the job's steps per second over ``--after-s`` once the new gang trains, over its steps
  per second over the ``--warm-s`` before the slow-down (the job's step: its slowest shard's, polled every second);
- ``steps_lost``: the last step the old gang's ranks completed (the state each kept) less the step the new gang
  resumed from (their logs);
- ``straggler_s``: what the job's goodput ledger counts lost to the straggler;
- ``alert``: the monitor's first ``STRAGGLER`` alert on the job (read off the alerts topic), ``alert_s`` from the
  slow-down.

``link``: on a cluster of its own, rank 2's node's network slowed (``--link-ms`` a round trip: the hook's ``.link``
file; its shards wait that long at each sync and its links' probes take that long more): the verdict (``SLOW_LINK``,
naming a link of that node, and no swap), ``detect_s``, the monitor's ``SLOW_LINK`` alert (``alert_s``) and the
steps per second before and after. 300 ms by default: a step here is about 100 ms, most of it the gang's wait on
two shared cores, and a smaller delay hides in it.

``imbalanced``: on a cluster of its own, a job whose ranks' slices differ (2 samples and 1): the verdict
(``IMBALANCED_JOB``, no swap). Its ``detect_s`` counts from the end of ``--warm-s`` of training.

``healthy``: on a cluster of its own (four A100:2 nodes), four 2-shard jobs train for ``--healthy-s`` (600: the issue's
ten minutes) beside one CPU hog per core at normal priority: ``false_swaps`` (swaps decided: there is no straggler)
and every ``job.straggling`` said (``verdicts``).

CPU seconds per component (``/proc``: the broker, the services, the agents, the shards) over each phase.

    python bench/straggler.py [--only swap|link|imbalanced|healthy] [--warm-s 30] [--after-s 60] [--link-ms 300]
        [--healthy-s 600] [--record DIR] [--smoke]
"""

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from elastic_resize import steps_lost
from shardyard.bus.replay import replay
from shardyard.bus.topics import ALERTS, LINKS, SHARD_EVENTS
from shardyard.cli import client, cluster
from shardyard.cli.cluster_info import ClusterInfo
from shardyard.events import AlertFiring, AlertRule, Event, LinkMeasured, ShardProgress
from shardyard.training.artifacts import create_demo_artifacts
from shardyard.training.gpt2 import TinyGPTConfig
from shardyard.training.slowdown import SLOWDOWN_DIR_ENV
from smoke import parse_args

EXAMPLE = json.loads((Path(__file__).parents[1] / "examples" / "fine_tune_gpt2.json").read_text())
SMOKE = {"warm_s": 12.0, "after_s": 10.0, "healthy_s": 20.0}
HOG = "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\nwhile True: pass"
SHARD_LOG = re.compile(r"/(?P<job>[^/]+)/shard-(?P<rank>\d+)-attempt-(?P<attempt>\d+)\.log$")


def job_document(
    task_id: str,
    *,
    shards: int,
    steps: int = 1_000_000,
    batch: int = 8,
    training: dict[str, Any] | None = None,
    **more: Any,
) -> bytes:
    """Gradient averaging (every step a sync), a global batch of ``batch``; it trains until cancelled."""
    document = {**EXAMPLE, "task_id": task_id, "sync_interval": 1, "shard_count": shards, "priority": 1, **more}
    gpu = {"count": shards, "model": "A100", "min_flops": 35}
    document["resource_requirements"] = {"gpu": gpu, "memory": f"{shards}GiB", "cpu_cores": shards}
    document["training"] = {"max_steps": steps, "batch_size": batch // shards, "seed": 3, **(training or {})}
    return json.dumps(document).encode()


def until(check: Callable[[], Any], what: str, timeout_s: float, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every_s)
    raise SystemExit(f"timed out after {timeout_s:.0f}s waiting for {what}")


def job(info: ClusterInfo, job_id: str) -> dict[str, Any]:
    return client.job(info.monitor_url, job_id) or {}


def shard_pid(job_id: str, rank: int, attempt: int) -> int | None:
    """The live process of ``job_id``'s shard ``rank`` in ``attempt`` (named by the log its output goes to)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if b"shardyard.training" not in Path(f"/proc/{name}/cmdline").read_bytes():
                continue
            found = SHARD_LOG.search(os.readlink(f"/proc/{name}/fd/1"))
        except OSError:
            continue
        if found and (found["job"], int(found["rank"]), int(found["attempt"])) == (job_id, rank, attempt):
            return int(name)
    return None


def training(info: ClusterInfo, job_id: str, attempt: int | None, size: int) -> bool:
    """Whether ``size`` shards of ``attempt`` (None: the job's current one) have trained a step."""
    found = job(info, job_id)
    attempt = found.get("attempt") if attempt is None else attempt
    shards = found.get("shards", {})
    return sum(1 for s in shards.values() if s.get("attempt") == attempt and s.get("step", 0) > 0) == size


def slowed_rank(found: dict[str, Any]) -> list[dict[str, Any]]:
    """What the fault manager said of rank 2 of the first attempt (any other verdict is listed apart)."""
    return [s for s in found.get("stragglers", []) if s["shard_index"] == 2 and s["attempt"] == 1]


def rate(info: ClusterInfo, job_id: str, seconds: float) -> float:
    """The job's steps per second over the next ``seconds`` (its slowest shard's step, read at both ends)."""
    start, t0 = job(info, job_id).get("step", 0), time.monotonic()
    time.sleep(seconds)
    return (job(info, job_id).get("step", 0) - start) / (time.monotonic() - t0)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_component(run_dir: Path) -> dict[str, float]:
    """CPU seconds used so far: the cluster's processes by name, and the shards together."""
    out: dict[str, float] = {}
    for name, pid in ClusterInfo.load(run_dir).pids.items():
        try:
            out[name] = cpu_seconds(pid)
        except (OSError, IndexError):
            continue
    shards = 0.0
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and b"shardyard.training" in Path(f"/proc/{pid}/cmdline").read_bytes():
                shards += cpu_seconds(int(pid))
        except (OSError, IndexError):
            continue
    out["shards (live ones)"] = shards
    return out


def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: round(after[name] - before.get(name, 0.0), 1) for name in sorted(after)}


def at(entry: dict[str, Any]) -> float:
    return datetime.fromisoformat(entry["at"]).timestamp()


def record(info: ClusterInfo, jobs: list[str], path: Path | None) -> None:
    """Every progress report of ``jobs`` in the log, and every link measured, as JSON lines at ``path``
    (``--record``): the detector's unit tests replay such streams. A report's line: [seconds from the first line,
    job, rank, attempt, node, samples/s, step ms, own ms]; a link's, five long: [seconds, "link", node, peer, median RTT
    ms]."""
    if path is None:
        return
    events: list[Event] = []
    asyncio.run(replay(info.bootstrap, [SHARD_EVENTS, LINKS], lambda _t, e: events.append(e)))
    kept = sorted(
        (e for e in events if isinstance(e, LinkMeasured) or (isinstance(e, ShardProgress) and e.job_id in jobs)),
        key=lambda e: e.occurred_at,
    )
    if not kept:
        return
    t0, lines = kept[0].occurred_at, []
    for e in kept:
        t = round((e.occurred_at - t0).total_seconds(), 3)
        if isinstance(e, ShardProgress):
            figures = [round(e.samples_per_s, 2), round(e.step_ms, 2), round(e.compute_ms, 2)]
            lines.append([t, e.job_id, e.shard_index, e.attempt, e.node_id, *figures])
        elif isinstance(e, LinkMeasured):
            lines.append([t, "link", e.node_id, e.peer_id, round(e.rtt_median_ms, 2)])
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def alerts(info: ClusterInfo, rule: AlertRule, subject: Callable[[str], bool]) -> list[AlertFiring]:
    """The monitor's ``rule`` alerts fired so far whose subject passes ``subject`` (read off the alerts topic)."""
    events: list[AlertFiring] = []
    asyncio.run(replay(info.bootstrap, [ALERTS], lambda _t, e: events.append(e)))
    return [e for e in events if isinstance(e, AlertFiring) and e.rule is rule and subject(e.subject)]


def alert_figures(fired: list[AlertFiring], slowed_at: float) -> dict[str, Any] | None:
    """The first alert fired since the slow-down: its time from it (``alert_s``) and what it said. (One fired before is
    not about it: on a loaded host a probe's burst now and then reads a link's bandwidth as slow.)"""
    since = [e for e in fired if e.occurred_at.timestamp() >= slowed_at]
    if not since:
        return None
    first = min(since, key=lambda e: e.occurred_at)
    return {"alert_s": round(first.occurred_at.timestamp() - slowed_at, 2), "summary": first.summary}


def swap(root: Path, warm_s: float, after_s: float, recording: Path | None = None) -> dict[str, Any]:
    run_dir, quiet = root / "swap-run", (lambda _m: None)
    slow_dir = root / "slowdown"
    slow_dir.mkdir()
    os.environ[SLOWDOWN_DIR_ENV] = str(slow_dir)  # the processes ``up`` starts inherit it, the shards too
    info = cluster.up(run_dir, nodes=("A100:1",) * 5, replicas=1, data_root=root / "data", say=quiet)
    try:
        client.submit(info.bootstrap, job_document("slowed", shards=4))
        until(lambda: training(info, "slowed", 1, 4), "the job training at 4", 300)
        cpu0 = cpu_by_component(run_dir)
        before = rate(info, "slowed", warm_s)
        node = next(p["node_id"] for p in job(info, "slowed")["placements"] if p["shard_index"] == 2)
        slowed_at = time.time()
        (slow_dir / node).write_text("2")  # rank 2's node at half speed: whatever runs there
        said = until(lambda: slowed_rank(job(info, "slowed")), "rank 2 found a straggler", 180)
        until(lambda: training(info, "slowed", 2, 4), "the re-formed gang training", 180)
        replaced_at = time.time()
        after = rate(info, "slowed", after_s)
        found = job(info, "slowed")
        cpu1 = cpu_by_component(run_dir)
        client.request_cancel(info.bootstrap, "slowed", requested_by="bench")
        record(info, ["slowed"], recording)
        fired = alerts(info, AlertRule.STRAGGLER, lambda subject: subject == "slowed")
        first = said[0]
        return {
            "alert": alert_figures(fired, slowed_at),
            "verdicts": found.get("stragglers", []),
            "slowed": {"node": node, "by": "shardyard.training.slowdown: own time a step x2"},
            "verdict": {k: first[k] for k in ("kind", "action", "shard_index", "node_id", "ratio")},
            "detect_s": round(datetime.fromisoformat(first["occurred_at"]).timestamp() - slowed_at, 2),
            "since_s": round(datetime.fromisoformat(first["since"]).timestamp() - slowed_at, 2),
            "replace_s": round(replaced_at - slowed_at, 2),
            "steps_per_s": {"before": round(before, 3), "after": round(after, 3)},
            "throughput_recovered": round(after / before, 3) if before else None,
            "steps_lost": steps_lost(run_dir, "slowed", 2),
            "placed_after": sorted(p["node_id"] for p in found["placements"] if not p.get("spare")),
            "retries": sum(1 for e in found["timeline"] if e["event"] == "recovering") - 1,
            "straggler_s": found["goodput"]["straggler_s"],
            "cpu_s": spent(cpu0, cpu1),
        }
    finally:
        cluster.down(run_dir, say=quiet)
        os.environ.pop(SLOWDOWN_DIR_ENV, None)


def verdict_of(info: ClusterInfo, job_id: str, slowed_at: float) -> dict[str, Any]:
    """The fault manager's first verdict on ``job_id`` (polled), the time it took, and whether the job was swapped."""
    said = until(lambda: job(info, job_id).get("stragglers"), f"a verdict on {job_id}", 180)
    first = min(said, key=lambda s: s["occurred_at"])
    keys = ("kind", "action", "shard_index", "node_id", "peer_id", "ratio")
    return {
        "verdict": {k: first[k] for k in keys},
        "detect_s": round(datetime.fromisoformat(first["occurred_at"]).timestamp() - slowed_at, 2),
        "verdicts": said,
    }


def link_alert(info: ClusterInfo, node: str, slowed_at: float, timeout_s: float = 120.0) -> dict[str, Any]:
    """The monitor's first ``SLOW_LINK`` alert on a link of ``node`` since the slow-down (it waits out its 30 s); if
    none comes within ``timeout_s``, every ``SLOW_LINK`` alert seen (``alert_s`` None)."""
    deadline = time.monotonic() + timeout_s
    while True:
        fired = alerts(info, AlertRule.SLOW_LINK, lambda _subject: True)
        found = alert_figures([e for e in fired if node in e.subject.split("|")], slowed_at)
        if found is not None or time.monotonic() > deadline:
            break
        time.sleep(2)
    seen = [f"{e.occurred_at.timestamp() - slowed_at:.1f} s: {e.summary}" for e in fired]
    return found or {"alert_s": None, "seen": seen}


def not_a_node(root: Path, part: str, warm_s: float, slow: dict[str, str], recording: Path | None) -> dict[str, Any]:
    """``link``: rank 2's node's network made slower (``slow["link_ms"]`` a round trip, the hook's ``.link`` file)
    once a 4-shard job has trained ``warm_s`` on five A100:1 nodes. ``imbalanced``: an elastic job preferring 3
    shards of 1 sample on two A100:1 nodes, so that it runs at 2 with slices of 2 and 1 samples a step (a wider model
    and longer sequences than the demo's, so that a sample's compute outweighs a step's fixed costs). Either way no
    node is slow: the verdict must say so (``SLOW_LINK``, ``IMBALANCED_JOB``) and nothing is swapped."""
    run_dir, slow_dir, quiet = root / f"{part}-run", root / f"slowdown-{part}", (lambda _m: None)
    slow_dir.mkdir()
    os.environ[SLOWDOWN_DIR_ENV] = str(slow_dir)
    link = "link_ms" in slow
    nodes, size = (("A100:1",) * 5, 4) if link else (("A100:1",) * 2, 2)
    data = root / "data" if link else root / "data-wide"
    if not link:  # a wider model than the demo's: a sample's compute, not a step's fixed costs, sets a rank's time
        create_demo_artifacts(data, model_config=TinyGPTConfig(n_positions=512, n_embd=256, n_layer=4))
    info = cluster.up(run_dir, nodes=nodes, replicas=1, data_root=data, say=quiet)
    try:
        more: dict[str, Any] = {} if link else {"elasticity": {"min_shards": 2, "max_shards": 4}}
        more["training"] = {} if link else {"seq_len": 512}
        client.submit(info.bootstrap, job_document(part, shards=4 if link else 3, batch=8 if link else 3, **more))
        # an elastic job may start smaller, while an agent still registers, and grow to 2: its current attempt
        until(lambda: training(info, part, None, size), f"the job training at {size}", 300)
        cpu0 = cpu_by_component(run_dir)
        before = rate(info, part, warm_s)  # the gang's healthy waits: what the detector judges a slow link's against
        node = next((p["node_id"] for p in job(info, part)["placements"] if p["shard_index"] == 2), "")
        slowed_at = time.time()
        if link:
            (slow_dir / f"{node}.link").write_text(slow["link_ms"])
        found = verdict_of(info, part, slowed_at)
        slowed = rate(info, part, warm_s)
        fired = link_alert(info, node, slowed_at) if link else None
        after = job(info, part)
        cpu1 = cpu_by_component(run_dir)
        client.request_cancel(info.bootstrap, part, requested_by="bench")
        record(info, [part], recording)
        return {
            "slowed": (
                {"node": node, "by": f"shardyard.training.slowdown: {slow['link_ms']} ms a round trip"}
                if link
                else {"by": "slices of 2 and 1 samples a step"}
            ),
            **found,
            "alert": fired,
            "steps_per_s": {"before": round(before, 3), "after": round(slowed, 3)},
            "attempt": after.get("attempt"),
            "swapped": any(s["action"] == "SWAP" for s in after.get("stragglers", [])),
            "cpu_s": spent(cpu0, cpu1),
        }
    finally:
        cluster.down(run_dir, say=quiet)
        os.environ.pop(SLOWDOWN_DIR_ENV, None)


def healthy(root: Path, seconds: float, recording: Path | None = None) -> dict[str, Any]:
    run_dir, quiet = root / "healthy-run", (lambda _m: None)
    info = cluster.up(run_dir, nodes=("A100:2",) * 4, replicas=1, data_root=root / "data", say=quiet)
    hogs: list[subprocess.Popen[bytes]] = []
    names = [f"healthy-{i}" for i in range(4)]
    try:
        for name in names:
            client.submit(info.bootstrap, job_document(name, shards=2))
        until(lambda: all(training(info, name, 1, 2) for name in names), "four jobs training", 300)
        cpu0 = cpu_by_component(run_dir)
        hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(os.cpu_count() or 2)]
        time.sleep(seconds)  # the measured span itself: every straggler said meanwhile is read below
        cpu1 = cpu_by_component(run_dir)
        jobs = {name: job(info, name) for name in names}
        record(info, names, recording)
        said = [s for j in jobs.values() for s in j.get("stragglers", [])]
        return {
            "healthy_s": seconds,
            "jobs": len(names),
            "hog_processes": len(hogs),
            "false_swaps": sum(1 for s in said if s["action"] == "SWAP"),
            "verdicts": said,
            "attempts": {name: j.get("attempt") for name, j in jobs.items()},
            "steps": {name: j.get("step") for name, j in jobs.items()},
            "cpu_s": spent(cpu0, cpu1),
        }
    finally:
        for hog in hogs:
            hog.terminate()
        for hog in hogs:
            hog.wait(timeout=10)
        cluster.down(run_dir, say=quiet)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("swap", "link", "imbalanced", "healthy"), help="one part only")
    parser.add_argument("--link-ms", type=float, default=300.0, help="link: what the slow network adds a round trip")
    parser.add_argument("--warm-s", type=float, default=30.0, help="swap: trained at 4 before the slow-down")
    parser.add_argument("--after-s", type=float, default=60.0, help="swap: throughput measured after the swap")
    parser.add_argument("--healthy-s", type=float, default=600.0, help="healthy: how long four jobs are watched")
    parser.add_argument("--record", type=Path, help="write each part's progress reports to DIR/<part>.jsonl")
    args = parse_args(parser, SMOKE)
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="shardyard-straggler-") as tmp:
        root = Path(tmp)
        create_demo_artifacts(root / "data")
        recorded = (lambda part: args.record / f"{part}.jsonl") if args.record else (lambda _part: None)
        if args.only in (None, "swap"):
            figures["swap"] = swap(root, args.warm_s, args.after_s, recorded("swap"))
        if args.only in (None, "link"):
            figures["link"] = not_a_node(root, "link", args.warm_s, {"link_ms": str(args.link_ms)}, recorded("link"))
        if args.only in (None, "imbalanced"):
            figures["imbalanced"] = not_a_node(root, "imbalanced", args.warm_s, {}, recorded("imbalanced"))
        if args.only in (None, "healthy"):
            figures["healthy"] = healthy(root, args.healthy_s, recorded("healthy"))
    swapped = figures.get("swap", {})
    targets = {
        "detect_s <= 30": swapped.get("detect_s", 1e9) <= 30,
        "replace_s <= 60": swapped.get("replace_s", 1e9) <= 60,
        "throughput_recovered >= 0.95": (swapped.get("throughput_recovered") or 0) >= 0.95,
        "steps_lost == 0": swapped.get("steps_lost") == 0,
        "false_swaps == 0": figures.get("healthy", {}).get("false_swaps", 1) == 0,
    }
    print(json.dumps({"bench": "straggler", **figures, "targets": targets}, indent=2))


if __name__ == "__main__":
    main()
