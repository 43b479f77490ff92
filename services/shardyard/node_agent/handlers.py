"""Node-agent handlers: assignments start, hold (spares) and stop shard processes; heartbeats and shard events go
out.

Lifecycle events tell the agent which artifact paths live jobs need (``ArtifactWatch``); the agent polls the absent
ones and sends a heartbeat at once when one appears, so a job waiting for its dataset here hears of it quickly.

Where a shard of a job is likely to start soon (a spare held, a shard that failed in a way its gang recovers from, a
gang member that could be lost), the agent keeps a warm standby for the job (:mod:`.warm`), and a launch of the
built-in runner for that job takes it instead of starting a cold process.

An agent running as root starts each job's shards, and its standbys, as a user of the job's own (:mod:`.shard_users`),
with the directories they write made theirs alone and their logs the agent's (:mod:`.private_files`).

Every publish has a deadline (:class:`Outbox`). The lease is renewed by each heartbeat the bus acknowledges; when
it runs out the agent stops its shards (self-fencing) and reports their end once the bus is back.
"""

import asyncio
import json
import logging
import os
import shutil
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.trace import Span

from shardyard import tracing
from shardyard.clock import Clock
from shardyard.events import (
    ArtifactError,
    FailureCause,
    GpuStatus,
    Heartbeat,
    ShardAssignment,
    ShardFailed,
    ShardProgress,
    ShardRevocation,
    ShardStarted,
    ShardStopRequest,
)
from shardyard.lifecycle import TERMINAL, LifecycleFact, target_state
from shardyard.node_agent.artifacts import ArtifactWatch, unreadable
from shardyard.node_agent.beats import DEFAULT_REFRESH_S, Beats
from shardyard.node_agent.book import (
    PROGRESS_FD_ENV,
    AgentBook,
    RunnerOptions,
    ShardKey,
    Verdict,
    key_of,
    private_home,
    shard_argv,
    shard_env,
)
from shardyard.node_agent.fencing import DEFAULT_LEASE_S, fence_message, lease_expired
from shardyard.node_agent.inventory import GpuProbe
from shardyard.node_agent.launcher import Launcher, LaunchSpec, ShardProcess, Standby, tail
from shardyard.node_agent.load import LoadSource, host_load, shards_load
from shardyard.node_agent.mounts import LocalDisk, PathProbe, look
from shardyard.node_agent.outbox import Outbox, Publisher
from shardyard.node_agent.private_files import ShardFiles, give_log
from shardyard.node_agent.shard_users import ShardUsers
from shardyard.node_agent.warm import DEFAULT_GANG_AFTER_S, DEFAULT_TTL_S, WARM_AFTER, Mode, WarmBook
from shardyard.training import standby
from shardyard.training.lease import renew
from shardyard.training.preemption import STOP_SIGNAL

log = logging.getLogger(__name__)

TERMINATE_GRACE_S = 5.0


@dataclass(frozen=True)
class NodeIdentity:
    node_id: str
    instance: str
    address: str
    rendezvous_ports: tuple[int, int]
    cpu_cores: float
    memory_bytes: int
    mounts: Mapping[str, str]
    log_dir: Path
    python: str
    base_env: Mapping[str, str]
    load_source: LoadSource = "host"
    topology: Mapping[str, str] = field(default_factory=dict)
    runner: RunnerOptions = field(default_factory=RunnerOptions)
    standbys: Mode = "gang"
    """Which warm standbys to keep for the jobs whose shards are likely to start here soon."""
    standby_ttl_s: float = DEFAULT_TTL_S
    standby_after_s: float = DEFAULT_GANG_AFTER_S
    """``gang`` mode: how long a shard trains before its standby is started (short runs never pay for one)."""
    status_refresh_s: float = DEFAULT_REFRESH_S
    """A full heartbeat at least this often; leases between (:mod:`shardyard.node_agent.beats`)."""
    shard_users: ShardUsers = field(default_factory=ShardUsers)
    """Who each job's shards run as (by default the agent's own user)."""
    scratch_dir: Path | None = None
    """Where a shard under a user of its own gets its private HOME and TMPDIR, one directory per job."""


def _shown(job_path: str, limit: int = 120) -> str:
    """A job path for a log line: a path of thousands of characters is cut, with its length said."""
    return repr(job_path) if len(job_path) <= limit else f"{job_path[:limit]!r}... ({len(job_path)} characters)"


def _host_load() -> float:
    return host_load(os.getloadavg()[0], os.cpu_count() or 1)


class AgentHandlers:
    def __init__(
        self,
        identity: NodeIdentity,
        book: AgentBook,
        bus: Publisher,
        clock: Clock,
        gpus: GpuProbe,
        launcher: Launcher,
        *,
        watch: ArtifactWatch | None = None,
        disk: PathProbe | None = None,
        host_load: Callable[[], float] = _host_load,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> None:
        self.me = identity
        self.book = book
        self.outbox = Outbox(bus, timeout_s=lease_s)
        self.lease_s = lease_s
        self.clock = clock
        self.bus_ok_at = clock.monotonic()
        """When a heartbeat last reached the bus (monotonic seconds): the lease runs from here."""
        self.gpus = gpus
        self.launcher = launcher
        self.watch = watch or ArtifactWatch()
        self.files = ShardFiles(identity.shard_users, identity.runner, identity.scratch_dir)
        self.disk = disk or LocalDisk()
        self.host_load = host_load
        self.processes: dict[ShardKey, ShardProcess] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.warm: WarmBook[Standby] = WarmBook(limit=max(1, len(gpus.uuids())), ttl_s=identity.standby_ttl_s)
        self._warming: set[asyncio.Task[None]] = set()
        self._gang_due: dict[ShardKey, float] = {}
        """``gang`` mode: training shards without their standby yet -> when it is due (monotonic seconds)"""
        self._members: dict[str, int] = {}
        """job -> the most shards of it that ran here at once (as many standbys are worth keeping after a failure)"""
        self._standbys = 0
        self.seq = 0
        self.beats = Beats(refresh_s=identity.status_refresh_s)
        """Full heartbeat or lease, beat by beat."""
        self._beat_lock = asyncio.Lock()  # one heartbeat at a time: seq order is publish order

    async def on_assignment(self, event: object) -> None:
        if isinstance(event, ShardRevocation):
            await self._revoke(event)
            return
        if isinstance(event, ShardStopRequest):
            self._stop(event)
            return
        if not isinstance(event, ShardAssignment) or event.node_id != self.book.node_id:
            return  # another node's assignment: no span in the job's trace for a node that does nothing with it
        with tracing.job_span("assignment", event.job_id, attributes=tracing.event_attributes(event)) as span:
            await self._on_assignment(event, span)

    async def _on_assignment(self, event: ShardAssignment, span: Span) -> None:
        verdict = self.book.on_assignment(event)
        span.set_attribute("shardyard.verdict", verdict.name)
        if verdict is Verdict.STALE_TERM:
            log.warning("refusing %s: term %d is older than %d", key_of(event), event.term, self.book.max_term)
        if verdict is Verdict.HOLD_SPARE:
            log.info("holding GPUs %s as a spare for %s", event.gpu_indices, key_of(event))
            if event.workload.entrypoint is None and self.me.standbys != "none":
                self._start_warming(event.job_id)
        if verdict is not Verdict.LAUNCH:
            return
        with tracing.job_span("launch", event.job_id, attributes=tracing.event_attributes(event)):
            await self._launch(event)  # the shard process continues the trace from the launch span

    async def _launch(self, assignment: ShardAssignment) -> None:
        key = key_of(assignment)
        paths = self.book.paths(assignment, self.me.mounts)
        try:
            missing = paths.missing()
        except (OSError, ValueError) as exc:  # one job's unreadable path fails that shard, not the handler
            missing = [f"inputs that cannot be looked at ({unreadable(exc).message})"]
        if missing:
            await self._finish(
                key, None, f"missing on {self.me.node_id}: {', '.join(missing)}", FailureCause.MISSING_ARTIFACT
            )
            return
        job, shard, attempt = key
        user = self.me.shard_users.of(job)
        blocked = self.files.blocked(paths, user)
        if blocked is not None:
            await self._finish(key, None, f"on {self.me.node_id}, {blocked}", FailureCause.LAUNCH_ERROR)
            return
        log_path = self.me.log_dir / job / f"shard-{shard}-attempt-{attempt}.log"
        # An entrypoint sees every GPU of the node (LOCAL_RANK is its own): LOCAL_WORLD_SIZE is their number.
        local_world_size = len(self.gpus.uuids()) if assignment.workload.entrypoint is not None else 1
        env = shard_env(
            assignment,
            paths,
            base_env=self.me.base_env,
            options=self.me.runner,
            local_world_size=local_world_size,
            home=self.files.home(job, user),
        )
        spec = LaunchSpec(
            argv=shard_argv(assignment, paths, python=self.me.python),
            env=tracing.child_env(env, assignment.job_id),
            cwd=Path.cwd(),
            log_path=log_path,
            user=user,
        )
        await self._older_attempts_gone(assignment)
        try:
            self.files.prepare(assignment, paths, log_path, user)
            process = await self._warm_process(assignment, spec)
            if process is None:
                process = await self.launcher.launch(spec, progress_env=PROGRESS_FD_ENV)
        except OSError as exc:
            await self._finish(key, None, f"cannot start the shard: {exc}", FailureCause.LAUNCH_ERROR)
            return
        self.processes[key] = process
        here = sum(1 for k in self.processes if k[0] == job)
        self._members[job] = max(self._members.get(job, 0), here)
        if key in self.book.fenced:  # fenced while it was being started
            self._terminate(process)
        await self.outbox.deliver(
            ShardStarted(
                occurred_at=self.clock.now(),
                job_id=job,
                shard_index=shard,
                attempt=attempt,
                node_id=self.me.node_id,
                pid=process.pid,
            )
        )
        task = asyncio.create_task(self._watch(key, process, log_path), name=f"shard-{job}-{shard}-{attempt}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _older_attempts_gone(self, assignment: ShardAssignment) -> None:
        """Wait until this node's shards of the job's older attempts have exited (they were revoked just before):
        two attempts never share a GPU, and a survivor of the broken gang has kept its state (peer state) before the
        new gang looks for it. At most the revocation's grace period: SIGKILL ends them by then."""
        older = [
            process
            for (job, _, attempt), process in self.processes.items()
            if job == assignment.job_id and attempt < assignment.attempt
        ]
        if older:
            waits = [asyncio.ensure_future(process.wait()) for process in older]
            _, pending = await asyncio.wait(waits, timeout=TERMINATE_GRACE_S + 1.0)
            for wait in pending:
                wait.cancel()

    async def _warm_process(self, assignment: ShardAssignment, spec: LaunchSpec) -> ShardProcess | None:
        """The job's warm standby, given the shard's order; None when there is none (or it died: start cold)."""
        if assignment.workload.entrypoint is not None:
            return None
        while (warm := self.warm.take(assignment.job_id)) is not None:
            give_log(spec.log_path, spec.user)  # the standby opens it itself, as the job's user
            try:
                process = await warm.go(standby.Order(env=spec.env, log=str(spec.log_path)).encode())
            except OSError as exc:
                log.warning("the standby for %s is gone (%s): trying the next", key_of(assignment), exc)
                continue
            log.info("%s: started from warm standby %d", key_of(assignment), process.pid)
            return process
        return None

    def _start_warming(self, job_id: str) -> None:
        if not self.warm.room():
            return
        self.warm.starting[job_id] += 1
        task = asyncio.create_task(self._warm_up(job_id), name=f"standby-{job_id}")
        self._warming.add(task)
        task.add_done_callback(self._warming.discard)

    async def _warm_up(self, job_id: str) -> None:
        self._standbys += 1
        user = self.me.shard_users.of(job_id)
        home = self.files.home(job_id, user)
        spec = LaunchSpec(
            argv=(self.me.python, "-m", standby.MODULE),
            env={**self.me.runner.net_env(), **self.me.base_env, "OMP_NUM_THREADS": "1", **private_home(home)},
            cwd=Path.cwd(),
            log_path=self.me.log_dir / job_id / f"standby-{self.me.node_id}-{self._standbys}.log",
            user=user,
        )
        try:
            self.files.prepare_standby(job_id, spec.log_path, user)
            warm = await self.launcher.standby(spec, progress_env=PROGRESS_FD_ENV)
        except OSError as exc:
            log.warning("cannot start a standby for %s: %s", job_id, exc)
            return
        finally:
            self.warm.starting[job_id] -= 1
            if not self.warm.starting[job_id]:
                del self.warm.starting[job_id]
        if self.watch.states.get(job_id) in TERMINAL:
            warm.discard()  # the job ended while it started
            return
        self.warm.add(job_id, warm, now=self.clock.monotonic())
        log.info("standby %d warming up for %s", warm.pid, job_id)

    def _warm_the_gang(self, key: ShardKey, first: bool) -> None:
        """``gang`` mode: a multi-shard job training here keeps a standby per shard of it here, started once the
        shard trained ``standby_after_s`` (called on each progress report; ``first``: the shard's first)."""
        assignment = self.book.running.get(key)
        if self.me.standbys != "gang" or assignment is None or assignment.workload.entrypoint is not None:
            return
        if assignment.world_size < 2:
            return
        now = self.clock.monotonic()
        if first:
            self._gang_due[key] = now + self.me.standby_after_s
        due = self._gang_due.get(key)
        if due is None or now < due:
            return
        del self._gang_due[key]
        here = sum(1 for job, _, _ in self.book.running if job == key[0])
        if self.warm.count(key[0]) < here:
            self._start_warming(key[0])

    def _expire_standbys(self) -> None:
        holding = {job for job, _, _ in self.book.spares} | {job for job, _, _ in self.book.running}
        for warm in self.warm.expired(self.clock.monotonic(), holding):
            warm.discard()
        for warm in self.warm.dead(lambda w: w.alive()):
            log.warning("standby %d ended by itself", warm.pid)
            warm.discard()  # reaps it

    async def _watch(self, key: ShardKey, process: ShardProcess, log_path: Path) -> None:
        final: dict[str, object] | None = None
        async for line in process.progress():
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if not isinstance(report, dict):
                continue
            if report.get("kind") == "progress":
                self._warm_the_gang(key, first=key not in self.book.utilization)
                self.book.utilization[key] = float(report.get("cpu_percent", 0.0)) / 100.0
                await self._progress(key, report)
            elif report.get("kind") == "checkpointed":
                await self._checkpointed(key, report)
            elif report.get("kind") in ("finished", "preempted"):
                final = report
        code = await process.wait()
        self.processes.pop(key, None)
        message = f"exit code {code}" + (f": {tail(log_path)}" if code else "")
        await self._finish(key, code, message, None, final)

    async def _checkpointed(self, key: ShardKey, report: Mapping[str, object]) -> None:
        event = self.book.checkpointed(key, report, now=self.clock.now())
        if event is not None:
            await self.outbox.deliver(event)

    async def _progress(self, key: ShardKey, report: Mapping[str, object]) -> None:
        job, shard, attempt = key
        pace = self.book.pace(key, report)
        if pace is not None:
            log.info("%s: sync interval %d -> %d steps after %s slow syncs", key, *pace, report.get("slow_syncs"))
        if not self.outbox.healthy:
            return  # the bus is out of reach: stale progress is worth nothing

        def number(name: str) -> float:
            value = report.get(name, 0)
            return float(value) if isinstance(value, int | float) else 0.0

        await self.outbox.publish(
            ShardProgress(
                occurred_at=self.clock.now(),
                job_id=job,
                shard_index=shard,
                attempt=attempt,
                node_id=self.me.node_id,
                step=int(number("step")),
                loss=number("loss"),
                samples_per_s=number("samples_per_s"),
                allreduce_ms=number("allreduce_ms"),
                allreduce_bytes=int(number("allreduce_bytes")),
                syncs=int(number("syncs")),
                cpu_percent=number("cpu_percent"),
            )
        )

    async def _finish(
        self,
        key: ShardKey,
        code: int | None,
        message: str,
        cause: FailureCause | None,
        final: Mapping[str, object] | None = None,
    ) -> None:
        assignment = self.book.running.get(key)
        self._gang_due.pop(key, None)
        event = self.book.finished(key, code, now=self.clock.now(), final=final, message=message, cause=cause)
        # Its gang is about to be re-formed, most likely with as many members here again.
        warm = isinstance(event, ShardFailed) and event.cause in WARM_AFTER and self.me.standbys != "none"
        warm = warm and assignment is not None and assignment.workload.entrypoint is None
        if warm and self.warm.count(key[0]) < self._members.get(key[0], 1):
            self._start_warming(key[0])
        if event is not None:
            await self.outbox.deliver(event)

    async def _revoke(self, revocation: ShardRevocation) -> None:
        key = self.book.on_revocation(revocation)
        process = self.processes.get(key) if key else None
        if process is not None:
            log.info("revoking %s: %s", key, revocation.reason)
            self._terminate(process)

    @staticmethod
    def _terminate(process: ShardProcess) -> None:
        """SIGTERM now, SIGKILL after the grace period (nothing happens to a process that is gone by then)."""
        process.terminate()
        asyncio.get_running_loop().call_later(TERMINATE_GRACE_S, process.kill)

    def start_lease(self) -> None:
        """The lease runs from now (start-up: before the first heartbeat, the agent has not lost anything)."""
        self.bus_ok_at = self.clock.monotonic()
        self._renew_shard_lease()

    def _renew_shard_lease(self) -> None:
        """Keep this agent's shards alive: they fence themselves when the lease file ages (agent paused or cut off)."""
        path = self.me.runner.lease_file
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            renew(path)

    async def check_lease(self) -> None:
        """Self-fencing: once no heartbeat reached the bus for ``lease_s``, stop every shard (they are reported
        REVOKED once the bus is back)."""
        now = self.clock.monotonic()
        if not lease_expired(now, self.bus_ok_at, self.lease_s):
            return
        message = fence_message(now - self.bus_ok_at)
        for key in self.book.fence(message):
            log.warning("stopping %s: %s", key, message)
            process = self.processes.get(key)
            if process is not None:
                self._terminate(process)

    def _stop(self, request: ShardStopRequest) -> None:
        key = self.book.on_stop_request(request)
        process = self.processes.get(key) if key else None
        if process is not None:
            log.info("asking %s to checkpoint and stop: %s", key, request.reason)
            process.signal(STOP_SIGNAL)

    async def on_lifecycle(self, event: LifecycleFact) -> None:
        """Learn the artifact paths of live jobs; a new one that is already here is reported at once."""
        added = self.watch.apply(event)
        if target_state(event) in TERMINAL:
            self._members.pop(event.job_id, None)
            for warm in self.warm.ended(event.job_id):
                warm.discard()
            # The job's gang will not be re-formed: its state and its private home here go.
            for kept in self.files.of_job(event.job_id):
                await asyncio.to_thread(shutil.rmtree, kept, True)
        if added and await self._look(added):
            await self.heartbeat()

    async def poll_artifacts(self) -> None:
        """Look for the watched paths not here yet; report at once when one appeared."""
        absent = self.watch.absent()
        if absent and await self._look(absent):
            await self.heartbeat()

    async def _look(self, job_paths: Iterable[str]) -> bool:
        """Stat ``job_paths`` (in a thread: a network filesystem may be slow) and record it; True when it changed.
        A path that cannot be looked at is that path's error, logged when it first appears (not at every poll)."""
        paths = list(job_paths)
        if not paths:
            return False
        mounts, disk = self.me.mounts, self.disk
        found = await asyncio.to_thread(lambda: {path: look(path, mounts, disk) for path in paths})
        for path, seen in found.items():
            if isinstance(seen, ArtifactError) and self.watch.errors.get(path) != seen:
                log.warning("artifact %s counts as absent: %s (%s)", _shown(path), seen.message, seen.reason)
        return self.watch.observe(found)

    def _load(self) -> float:
        if self.me.load_source == "shards":
            return shards_load(self.book.utilization.values(), self.me.cpu_cores)
        return self.host_load()

    async def heartbeat(self) -> None:
        self._expire_standbys()
        async with self._beat_lock:
            await self._look(self.watch.watched)  # every watched path: those that went away, too
            self.seq += 1
            pids = {key: process.pid for key, process in self.processes.items()}
            gpus = self.gpus.probe(self.book.gpu_utilization())
            self._stop_gpu_faulted(gpus)
            sent = self.clock.monotonic()
            beat = self.beats.next(
                Heartbeat(
                    occurred_at=self.clock.now(),
                    node_id=self.me.node_id,
                    agent_instance=self.me.instance,
                    seq=self.seq,
                    host=socket.gethostname(),
                    address=self.me.address,
                    rendezvous_ports=self.me.rendezvous_ports,
                    gpus=gpus,
                    cpu_cores=self.me.cpu_cores,
                    memory_bytes=self.me.memory_bytes,
                    cpu_load=round(self._load(), 4),
                    mounts=dict(self.me.mounts),
                    running=self.book.running_shards(pids),
                    artifacts=self.watch.report(),
                    topology=dict(self.me.topology),
                    artifact_errors=self.watch.report_errors(),
                ),
                sent,
            )
            delivered = await self.outbox.publish(beat)
            if delivered:  # the lease runs from the sending: the pool may have heard of us no later than that
                self.beats.delivered(beat, sent)
                self.bus_ok_at = max(self.bus_ok_at, sent)
                self._renew_shard_lease()
        if delivered and self.outbox.pending:
            await self.outbox.flush()

    def _stop_gpu_faulted(self, gpus: Iterable[GpuStatus]) -> None:
        """Stop every shard on a GPU that faulted: its end is reported as GPU_FAULT (the fault manager keeps the job
        off this node), whatever the dying process exits with."""
        faults = {gpu.index: gpu.fault or "unhealthy" for gpu in gpus if not gpu.healthy}
        if not faults:
            return
        for key in self.book.gpu_fault(faults, started=self.processes.keys()):
            log.warning("stopping %s: %s", key, self.book.gpu_faulted[key])
            self._terminate(self.processes[key])

    async def stop_all(self) -> None:
        """On shutdown: stop every shard and standby, wait for the shards to exit (SIGKILL after the grace period)."""
        for task in self._warming:
            task.cancel()
        for warm in self.warm.clear():
            warm.discard()
        for process in self.processes.values():
            process.terminate()
        if self.tasks:
            _, pending = await asyncio.wait(self.tasks, timeout=TERMINATE_GRACE_S)
            for process in self.processes.values():
                process.kill()
            if pending:
                await asyncio.wait(pending, timeout=TERMINATE_GRACE_S)
