"""Recovery figures on a local cluster (prints JSON).

For each scenario a fresh cluster of four 1-GPU A100 nodes (``--nodes``) runs a 2-shard job; mid-training (past
step 410, ``--kill-at-step``, some 10 s in: the agents start a training shard's warm standby after 5 s of training,
``--standby-after-s``) the agent of shard 1's node is killed with SIGKILL (its shards die with it). Measured from the
kill:

- ``detection_s``: until the resource pool marks the node SUSPECT (the ``occurred_at`` of the node's first state
  that is not ALIVE, read from the node-state topic); ``detection_seen_s``: until the monitor shows it (polled every
  20 ms);
- ``plan_s``: until the fault manager's recovery plan (``job.recovering``);
- ``resumed_s``: until the first training step of the re-formed gang (its first progress report);
- ``steps_lost``: the step the gang had reached at the kill minus the step it resumed from (``resumed_step``, from
  the re-formed shards' logs: its survivors' state, ``resumed_from_peers``, or the checkpoint); beside it the last
  sync before the kill and the sync interval in force then (slow syncs widen it, S19: the agents log each widening);
- ``warm_starts``: shards of the re-formed gang that started from a warm standby (the agents' logs), of ``members``.

Scenarios: ``spare`` (the fault manager's ratio floor is 0.5, so the gang holds a spare and it is promoted) and
``no_spare`` (ratio 0: the shard is re-placed on the free node).

``scheduler_failover``: on a fresh cluster (two schedulers), the scheduler leader is killed with SIGKILL and a 1-shard
job is submitted at once. Measured from the kill: ``elected_s``, until the standby's election (its
``service.leader`` event), and ``assignment_s``, until the shard's assignment reached the bus (a consumer of the
assignment topic, as an agent, receives it).

``--checkpoint-every N`` sets the agents' ``--checkpoint-every`` (default 1: a checkpoint at every sync); with a
large N the gang can only resume from its survivors' state (``shardyard.training.peer_state``) to lose under one sync
interval.

    python bench/recovery.py [--runs 1] [--only node-loss|failover] [--checkpoint-every N] [--kill-at-step 410]
        [--smoke]
"""

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer

from shardyard.bus.topics import ASSIGNMENTS, NODE_STATE, Topic
from shardyard.cli import client, cluster
from shardyard.cli.rundir import shard_log_dir
from shardyard.training.artifacts import create_demo_artifacts
from smoke import parse_args

EXAMPLE = json.loads((Path(__file__).parents[1] / "examples" / "fine_tune_gpt2.json").read_text())
KILL_AT_STEP = 410
"""Mid-interval (the job syncs every 20 steps), some 10 s into training: past the warm standby's start."""
NODES = 4
"""Nodes of a node-loss cluster: the gang, its spare and one free (3 is the least either scenario needs)."""
SMOKE = {"kill_at_step": 30, "nodes": 3}


def _job(job_id: str, *, shards: int = 2) -> bytes:
    document = {**EXAMPLE, "task_id": job_id, "sync_interval": 20, "shard_count": shards}
    document["resource_requirements"] = {**EXAMPLE["resource_requirements"], "gpu": {"count": shards, "model": "A100"}}
    document["training"] = {"max_steps": 3000, "batch_size": 4, "seed": 3}
    return json.dumps(document).encode()


def _text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2.0) as response:
        return str(response.read().decode())


def _poll(url: str, check: Any, timeout_s: float, every_s: float = 0.05, *, text: bool = False) -> Any:
    deadline = time.monotonic() + timeout_s
    body: Any = None
    while time.monotonic() < deadline:
        try:
            body = _text(url) if text else cluster.get_json(url)
            value = check(body)
        except OSError:
            value = None
        if value:
            return value
        time.sleep(every_s)
    what = getattr(check, "__name__", "a condition")
    if isinstance(body, dict) and "timeline" in body:
        body = {"state": body["state"], "timeline": [(e["event"], e.get("detail", "")[:80]) for e in body["timeline"]]}
    raise SystemExit(f"timed out after {timeout_s}s polling {url} for {what}; last answer: {str(body)[:3000]}")


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _sync_steps(job: dict[str, Any]) -> list[int]:
    """The steps of the first attempt's parameter syncs, from the job's timeline (``sync N at step S: ...``)."""
    syncs = [e["detail"] for e in job["timeline"] if e["event"] == "parameter sync"]
    found = (re.match(r"sync \d+ at step (\d+)", detail) for detail in syncs)
    return [int(m.group(1)) for m in found if m]


def _first_attempt_step(*snapshots: dict[str, Any]) -> int:
    """The highest step the first attempt's shards reported in any of the job's ``snapshots``. The one taken after the
    kill has the survivors' last reports, unless the job was already re-formed: its shards are then the new
    attempt's, or none yet while it recovers, and the one taken just before the kill is what is left."""
    steps = (
        shard.get("step", 0)
        for snapshot in snapshots
        for shard in snapshot["shards"].values()
        if shard.get("attempt", 1) == 1
    )
    return max(steps, default=0)


_RESUMED = re.compile(r"resuming from (?:(its peers' state) of step (\d+)|\S+ at step (\d+))")


def _resumed_step(shard_logs: Path) -> tuple[int | None, bool]:
    """The step the re-formed gang (attempt 2) resumed from, and whether from its peers' state, per its logs."""
    for log in sorted(shard_logs.glob("victim/shard-*-attempt-2.log")):
        found = _RESUMED.search(log.read_text(errors="replace"))
        if found:
            return int(found.group(2) or found.group(3)), found.group(1) is not None
    return None, False


def one_run(
    root: Path,
    *,
    spare: bool,
    checkpoint_every: int | None = None,
    kill_at_step: int = KILL_AT_STEP,
    nodes: int = NODES,
) -> dict[str, Any]:
    data = root / "data"
    create_demo_artifacts(data)
    settings = {"SHARDYARD_REDUNDANCY_MIN_RATIO": "0.5" if spare else "0"}
    if checkpoint_every is not None:
        settings["SHARDYARD_CHECKPOINT_EVERY"] = str(checkpoint_every)  # the agents' --checkpoint-every
    os.environ.update(settings)
    try:
        info = cluster.up(root / "run", nodes=["A100:1"] * nodes, data_root=data, say=lambda _m: None)
    finally:
        for name in settings:
            del os.environ[name]
    job_url = f"{info.monitor_url}/api/jobs/victim"
    try:
        if spare:  # the ratio comes from the fault manager's first tick; the monitor seeing it means it is published
            _poll(f"{info.monitor_url}/metrics", lambda body: "shardyard_spare_ratio 0.5" in body, 30, text=True)
        client.submit(info.bootstrap, _job("victim"))

        def training(j: dict[str, Any]) -> dict[str, Any] | None:
            return j if j["state"] == "RUNNING" and (j.get("step") or 0) >= kill_at_step else None

        job = _poll(job_url, training, 120)
        spares = [p for p in job["placements"] if p.get("spare")]
        victim = next(p["node_id"] for p in job["placements"] if p["shard_index"] == 1 and not p.get("spare"))
        with TopicWatch(info.bootstrap, NODE_STATE, _not_alive) as states:
            before_kill = cluster.get_json(job_url)
            killed = time.time()
            os.kill(info.pids[victim], signal.SIGKILL)
            states.wait_for(victim, timeout_s=30)
        after_kill = cluster.get_json(job_url)  # the survivors' progress can only have moved on since the kill
        step_at_kill = _first_attempt_step(before_kill, after_kill)
        sync_steps = _sync_steps(after_kill)
        nodes_url = f"{info.monitor_url}/api/nodes"

        def suspect(body: Any) -> bool:
            return any(n["node_id"] == victim and n["status"] != "ALIVE" for n in body["nodes"])

        _poll(nodes_url, suspect, 30, every_s=0.02)
        detected = time.time()

        def resumed(j: dict[str, Any]) -> float | None:
            """The first progress report of the re-formed gang (a shard's entry keeps its old report until then)."""
            starts = [_ts(e["at"]) for e in j["timeline"] if e["event"] == "shard started" and _ts(e["at"]) > killed]
            if not starts:
                return None
            shards = j["shards"].values()
            times = [_ts(s["updated_at"]) for s in shards if s.get("attempt", 1) >= 2 and "updated_at" in s]
            fresh = [t for t in times if t > min(starts)]  # not a survivor's report from before it failed
            return min(fresh) if fresh else None

        first_step = _poll(job_url, resumed, 120)
        decided_at = states.found[victim]
        job = cluster.get_json(job_url)
        agent_logs = "".join(p.read_text() for p in (root / "run" / "logs").glob("node-*.log"))
        plans = [e for e in job["timeline"] if e["event"] == "recovering"]
        last = job.get("last_checkpoint") or {}
        checkpoint_step = last.get("step") if last.get("attempt") == 1 else None
        resumed_step, from_peers = _resumed_step(shard_log_dir(root / "run", "victim"))
        widened = re.findall(r"\('victim', \d+, 1\): sync interval \d+ -> (\d+) steps", agent_logs)
        return {
            "spares_placed": len(spares),
            "detection_s": decided_at - killed,
            "detection_seen_s": detected - killed,
            "plan_s": _ts(plans[0]["at"]) - killed if plans else None,
            "resumed_s": first_step - killed,
            "members": len([p for p in job["placements"] if not p.get("spare")]),
            "warm_starts": len(re.findall(r"\('victim', \d+, 2\): started from warm standby", agent_logs)),
            "resumed_from": job.get("resume_from"),
            "attempt": job.get("attempt"),
            "step_at_kill": step_at_kill,
            "checkpoint_step": checkpoint_step,
            "resumed_step": resumed_step,
            "resumed_from_peers": from_peers,
            "steps_lost": step_at_kill - (resumed_step or 0),
            "sync_interval_submitted": 20,
            "last_sync_step": sync_steps[-1] if sync_steps else None,
            # Slow syncs widen the interval (S19): the last widening of the first attempt, as the agents logged it.
            "sync_interval_in_force": int(widened[-1]) if widened else 20,
        }
    finally:
        cluster.down(root / "run", say=lambda _m: None)


def failover_run(root: Path) -> dict[str, Any]:
    data = root / "data"
    create_demo_artifacts(data)
    info = cluster.up(root / "run", nodes=["A100:1"] * 2, data_root=data, say=lambda _m: None)
    try:

        def leader(body: Any) -> Any:
            return body["leaders"].get("scheduler")

        old = _poll(f"{info.monitor_url}/api/services", leader, 30)
        with TopicWatch(info.bootstrap, ASSIGNMENTS, _job_seen) as watch:
            killed = time.time()
            os.kill(info.pids[old["instance"]], signal.SIGKILL)
            client.submit(info.bootstrap, _job("after-failover", shards=1))
            delivered = watch.wait_for("after-failover", timeout_s=60)

        def successor(body: Any) -> Any:
            new = leader(body)
            return new if new and new["term"] > old["term"] else None

        new = _poll(f"{info.monitor_url}/api/services", successor, 30)
        return {
            "killed": old["instance"],
            "elected": new["instance"],
            "terms": [old["term"], new["term"]],
            "elected_s": _ts(new["occurred_at"]) - killed,
            "assignment_s": delivered - killed,
        }
    finally:
        cluster.down(root / "run", say=lambda _m: None)


def _job_seen(event: dict[str, Any], arrived: float) -> tuple[str, float] | None:
    """An assignment: its job, and when it reached us."""
    job = event.get("job_id")
    return (job, arrived) if job else None


def _not_alive(event: dict[str, Any], _arrived: float) -> tuple[str, float] | None:
    """A node state other than ALIVE: its node, and when the pool decided it."""
    if event.get("status") in (None, "ALIVE") or not event.get("node_id"):
        return None
    return event["node_id"], _ts(event["occurred_at"])


class TopicWatch:
    """Reads a topic from its end, as an agent does, on a thread. ``pick`` turns each event into (key, time) or
    None; ``found`` keeps the first time of each key, ``wait_for`` waits for a key."""

    def __init__(self, bootstrap: str, topic: Topic, pick: Any) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.pick = pick
        self.found: dict[str, float] = {}
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> "TopicWatch":
        self._thread.start()
        if not self._ready.wait(30):
            raise SystemExit(f"the watch of {self.topic.name} could not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    async def _run(self) -> None:
        consumer = AIOKafkaConsumer(self.topic.name, bootstrap_servers=self.bootstrap, auto_offset_reset="latest")
        await consumer.start()
        try:
            await consumer.seek_to_end()
            await asyncio.sleep(0)  # positions are resolved lazily: make sure they are before the kill
            for tp in consumer.assignment():
                await consumer.position(tp)
            self._ready.set()
            while not self._stop.is_set():
                for records in (await consumer.getmany(timeout_ms=50)).values():
                    for record in records:
                        hit = self.pick(json.loads(record.value or b"{}"), time.time())
                        if hit is not None:
                            self.found.setdefault(*hit)
        finally:
            await consumer.stop()

    def wait_for(self, key: str, *, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while key not in self.found:
            if time.monotonic() > deadline:
                raise SystemExit(f"nothing for {key} on {self.topic.name} within {timeout_s}s")
            time.sleep(0.01)
        return self.found[key]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--only", choices=("failover", "node-loss"), help="run one part only")
    parser.add_argument("--checkpoint-every", type=int, help="the agents' --checkpoint-every (default: theirs, 1)")
    parser.add_argument("--kill-at-step", type=int, default=KILL_AT_STEP, help="the gang's step at the agent's kill")
    parser.add_argument("--nodes", type=int, default=NODES, help="1-GPU nodes of a node-loss cluster (at least 3)")
    args = parse_args(parser, SMOKE)
    out: dict[str, Any] = {"bench": "recovery", "checkpoint_every": args.checkpoint_every or 1}
    if args.only != "node-loss":
        failovers = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                failovers.append(failover_run(Path(tmp)))
        out["scheduler_failover"] = {
            "runs": failovers,
            "median_assignment_s": statistics.median(r["assignment_s"] for r in failovers),
        }
    scenarios = (("spare", True), ("no_spare", False)) if args.only != "failover" else ()
    for name, spare in scenarios:
        runs = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                run = one_run(
                    Path(tmp),
                    spare=spare,
                    checkpoint_every=args.checkpoint_every,
                    kill_at_step=args.kill_at_step,
                    nodes=args.nodes,
                )
                runs.append(run)
        out[name] = {
            "runs": runs,
            "median_detection_s": statistics.median(r["detection_s"] for r in runs),
            "median_resumed_s": statistics.median(r["resumed_s"] for r in runs),
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
