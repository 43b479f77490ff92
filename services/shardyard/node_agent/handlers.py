"""Node-agent handlers: what the scheduler, the lifecycle topic and this node's shards say is taken to the book
(:mod:`.book`), and what the book decides is done by the part that owns the doing: the shard processes
(:mod:`.supervisor`), the warm standbys (:mod:`.standbys`), the artifact looks (:mod:`.artifact_poller`) and the
heartbeat with its lease (:mod:`.heartbeat`). No decisions here.

An assignment is launched, held (a spare: a standby may warm up for it) or refused; a revocation kills its shard, a
stop request asks it to checkpoint and stop. A shard's reports become progress and checkpoint events, its exit the
event of its end. A job's end ends its standbys and removes what the node kept for it.

Every publish has a deadline (:class:`Outbox`). The lease is renewed by each heartbeat the bus acknowledges; when
it runs out the agent stops its shards (self-fencing) and reports their end once the bus is back. A heartbeat that
finds a GPU faulted stops the shards on it; each says how much room the node's output disk has left (:mod:`.disk`).
"""

import asyncio
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.trace import Span

from shardyard import tracing
from shardyard.clock import Clock
from shardyard.events import (
    FailureCause,
    GpuStatus,
    Heartbeat,
    ShardAssignment,
    ShardRevocation,
    ShardStopRequest,
)
from shardyard.lifecycle import TERMINAL, LifecycleFact, target_state
from shardyard.node_agent.artifact_poller import ArtifactPoller
from shardyard.node_agent.artifacts import ArtifactWatch
from shardyard.node_agent.book import AgentBook, ShardKey, Verdict, key_of
from shardyard.node_agent.disk import measure, resume_here
from shardyard.node_agent.fencing import DEFAULT_LEASE_S
from shardyard.node_agent.heartbeat import Heartbeats, heartbeat_of
from shardyard.node_agent.identity import NodeIdentity
from shardyard.node_agent.inventory import GpuProbe
from shardyard.node_agent.launcher import Launcher
from shardyard.node_agent.load import host_load, shards_load
from shardyard.node_agent.mounts import LocalDisk, PathProbe
from shardyard.node_agent.outbox import Outbox, Publisher
from shardyard.node_agent.private_files import ShardFiles
from shardyard.node_agent.standbys import Standbys
from shardyard.node_agent.supervisor import Refused, Supervisor
from shardyard.training.preemption import STOP_SIGNAL
from shardyard.training.storage import Space, free_space

log = logging.getLogger(__name__)


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
        self.clock = clock
        self.gpus = gpus
        self.host_load = host_load
        self.files = ShardFiles(identity.shard_users, identity.runner, identity.scratch_dir)
        self.artifacts = ArtifactPoller(watch or ArtifactWatch(), identity.mounts, disk or LocalDisk())
        self.supervisor = Supervisor(identity, launcher, self.files, gpus, reports=self)
        self.standbys = Standbys(
            identity, launcher, self.files, clock, limit=max(1, len(gpus.uuids())), job_over=self.artifacts.watch.ended
        )
        self.heartbeats = Heartbeats(
            self.outbox,
            clock,
            lease_s=lease_s,
            refresh_s=identity.status_refresh_s,
            lease_file=identity.runner.lease_file,
        )

    @property
    def tasks(self) -> set[asyncio.Task[None]]:
        """The watchers of the node's shard processes: empty once every end was reported."""
        return self.supervisor.tasks

    @property
    def bus_ok_at(self) -> float:
        """When a heartbeat last reached the bus (monotonic seconds): the lease runs from here."""
        return self.heartbeats.bus_ok_at

    @property
    def disk(self) -> PathProbe:
        """Where the artifact looks go (a test may put a disk with faults of its own here)."""
        return self.artifacts.disk

    @disk.setter
    def disk(self, disk: PathProbe) -> None:
        self.artifacts.disk = disk

    # -- the scheduler's word ----------------------------------------------------------------------------------

    async def on_assignment(self, event: object) -> None:
        if isinstance(event, ShardRevocation):
            self._revoke(event)
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
            self.standbys.spare_held(event)
        if verdict is not Verdict.LAUNCH:
            return
        with tracing.job_span("launch", event.job_id, attributes=tracing.event_attributes(event)):
            await self._launch(event)  # the shard process continues the trace from the launch span

    async def _launch(self, assignment: ShardAssignment) -> None:
        key = key_of(assignment)
        paths, fresh = resume_here(
            assignment, self.book.paths(assignment, self.me.mounts), self.artifacts.watch.shared_prefixes
        )
        if fresh is not None:
            log.warning("%s: %s", key, fresh)
        spec = self.supervisor.plan(assignment, paths)
        if isinstance(spec, Refused):
            await self._finish(key, None, spec.message, spec.cause)
            return
        await self.supervisor.older_attempts_gone(assignment)
        try:
            self.files.prepare(assignment, paths, spec.log_path, spec.user)
            process = await self.standbys.take(assignment, spec)
            if process is None:
                process = await self.supervisor.launch(spec)
        except OSError as exc:
            await self._finish(key, None, f"cannot start the shard: {exc}", FailureCause.LAUNCH_ERROR)
            return
        self.supervisor.add(key, process)
        self.standbys.launched(assignment.job_id, here=self.supervisor.here(assignment.job_id))
        if key in self.book.fenced or key in self.book.revoked:  # fenced or revoked while it was being started
            self.supervisor.stop(key)
        await self.outbox.deliver(self.book.started(key, process.pid, now=self.clock.now()))
        self.supervisor.watch(key, process, spec.log_path)  # after the start: its reports and end come later

    def _revoke(self, revocation: ShardRevocation) -> None:
        key = self.book.on_revocation(revocation)
        if key is not None and self.supervisor.stop(key):
            log.info("revoking %s: %s %s", key, revocation.reason, revocation.message)

    def _stop(self, request: ShardStopRequest) -> None:
        key = self.book.on_stop_request(request)
        if key is not None and self.supervisor.signal(key, STOP_SIGNAL):
            log.info("asking %s to checkpoint and stop: %s %s", key, request.reason, request.message)

    # -- the shards' word (ShardReports) -----------------------------------------------------------------------

    async def progressed(self, key: ShardKey, report: Mapping[str, Any]) -> None:
        first = self.book.progressed(key, report)
        self.standbys.trained(key, self.book.live(key), first=first, here=self.book.running_of(key[0]))
        pace = self.book.pace(key, report)
        if pace is not None:
            log.info("%s: sync interval %d -> %d steps after %s slow syncs", key, *pace, report.get("slow_syncs"))
        if not self.outbox.healthy:
            return  # the bus is out of reach: stale progress is worth nothing
        await self.outbox.publish(self.book.progress(key, report, now=self.clock.now()))

    async def checkpointed(self, key: ShardKey, report: Mapping[str, Any]) -> None:
        event = self.book.checkpointed(key, report, now=self.clock.now())
        if event is not None:
            await self.outbox.deliver(event)

    async def exited(self, key: ShardKey, code: int, message: str, final: Mapping[str, Any] | None) -> None:
        assignment = self.book.live(key)
        space = None
        if code != 0 and assignment is not None:  # a failure on a full disk is DISK_FULL, whatever it exited with
            output = self.book.paths(assignment, self.me.mounts).output
            space = await asyncio.to_thread(free_space, output)
        await self._finish(key, code, message, None, final, space)

    async def _finish(
        self,
        key: ShardKey,
        code: int | None,
        message: str,
        cause: FailureCause | None,
        final: Mapping[str, object] | None = None,
        space: Space | None = None,
    ) -> None:
        assignment = self.book.live(key)
        now = self.clock.now()
        event = self.book.finished(key, code, now=now, final=final, message=message, cause=cause, space=space)
        self.standbys.shard_ended(key, assignment, event)
        if event is not None:
            await self.outbox.deliver(event)

    # -- the lifecycle's word ----------------------------------------------------------------------------------

    async def on_lifecycle(self, event: LifecycleFact) -> None:
        """Learn the artifact paths of live jobs; a new one that is already here is reported at once."""
        changed = await self.artifacts.learn(event)
        if target_state(event) in TERMINAL:
            self.standbys.job_ended(event.job_id)
            # The job's gang will not be re-formed: its state and its private home here go.
            for kept in self.files.of_job(event.job_id):
                await asyncio.to_thread(shutil.rmtree, kept, True)
        if changed:
            await self.heartbeat()

    async def poll_artifacts(self) -> None:
        """Look for the watched paths not here yet; report at once when one appeared."""
        if await self.artifacts.poll():
            await self.heartbeat()

    # -- the heartbeat and the lease ---------------------------------------------------------------------------

    def start_lease(self) -> None:
        self.heartbeats.start_lease()

    async def check_lease(self) -> None:
        """Self-fencing: once no heartbeat reached the bus for ``lease_s``, stop every shard (they are reported
        FENCED once the bus is back)."""
        message = self.heartbeats.lease_lost()
        if message is None:
            return
        for key in self.book.fence(message):
            log.warning("stopping %s: %s", key, message)
            self.supervisor.stop(key)

    async def heartbeat(self) -> None:
        self.standbys.expire(self.book.holding())
        await self.heartbeats.send(self._status)

    async def _status(self, seq: int) -> Heartbeat:
        await self.artifacts.look_watched()  # every watched path: those that went away, too
        pids = self.supervisor.pids()
        gpus = self.gpus.probe(self.book.gpu_utilization())
        self._stop_gpu_faulted(gpus)
        disk = await asyncio.to_thread(measure, self.me.output_path, self.me.mounts)  # statvfs may block (NFS)
        return heartbeat_of(
            self.me,
            seq=seq,
            now=self.clock.now(),
            gpus=gpus,
            cpu_load=self._load(),
            running=self.book.running_shards(pids),
            watch=self.artifacts.watch,
            output_disk=disk,
        )

    def _stop_gpu_faulted(self, gpus: Iterable[GpuStatus]) -> None:
        """Stop every shard on a GPU that faulted: its end is reported as GPU_FAULT (the fault manager keeps the job
        off this node), whatever the dying process exits with."""
        faults = {gpu.index: gpu.fault or "unhealthy" for gpu in gpus if not gpu.healthy}
        if not faults:
            return
        for key in self.book.gpu_fault(faults, started=self.supervisor.processes.keys()):
            log.warning("stopping %s: %s", key, self.book.gpu_faulted[key])
            self.supervisor.stop(key)

    def _load(self) -> float:
        if self.me.load_source == "shards":
            return shards_load(self.book.utilization.values(), self.me.cpu_cores)
        return self.host_load()

    async def stop_all(self) -> None:
        """On shutdown: stop every shard and standby, wait for the shards to exit (SIGKILL after the grace period)."""
        self.standbys.stop()
        await self.supervisor.stop_all()
