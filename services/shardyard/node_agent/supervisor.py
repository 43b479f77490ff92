"""The shard processes of this node: how each one is started (its command, environment, log and user), watched (its
progress channel read until it closes, then its exit) and stopped (SIGTERM, SIGKILL after a grace period; or the
stop signal that asks it to checkpoint first). What its reports and its exit mean is for the caller to say
(:class:`ShardReports`)."""

import asyncio
import json
import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from shardyard import tracing
from shardyard.events import FailureCause, ShardAssignment
from shardyard.node_agent.artifacts import unreadable
from shardyard.node_agent.book import ShardKey, key_of
from shardyard.node_agent.environment import PROGRESS_FD_ENV, ShardPaths, opened_env, shard_argv, shard_env
from shardyard.node_agent.identity import NodeIdentity
from shardyard.node_agent.inventory import GpuProbe
from shardyard.node_agent.launcher import Launcher, LaunchSpec, ShardProcess, tail
from shardyard.node_agent.private_files import ShardFiles
from shardyard.node_agent.shard_users import login_name
from shardyard.secret_env import SecretEnvError

TERMINATE_GRACE_S = 5.0


@dataclass(frozen=True)
class Refused:
    """A shard that cannot start here: its end is reported failed with this cause and message."""

    cause: FailureCause
    message: str


class ShardReports(Protocol):
    """Where a watched shard's reports and its end go."""

    async def progressed(self, key: ShardKey, report: Mapping[str, Any]) -> None: ...

    async def checkpointed(self, key: ShardKey, report: Mapping[str, Any]) -> None: ...

    async def exited(self, key: ShardKey, code: int, message: str, final: Mapping[str, Any] | None) -> None:
        """``final``: its last ``finished``, ``preempted`` or ``failed`` report, if any."""
        ...


def _report(line: bytes) -> dict[str, Any] | None:
    """One line of a progress channel; None when it is not a JSON object."""
    try:
        report = json.loads(line)
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


class Supervisor:
    def __init__(
        self, me: NodeIdentity, launcher: Launcher, files: ShardFiles, gpus: GpuProbe, reports: ShardReports
    ) -> None:
        self.me = me
        self.launcher = launcher
        self.files = files
        self.gpus = gpus
        self.reports = reports
        self.processes: dict[ShardKey, ShardProcess] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        """One watcher per shard process, until its end is reported."""

    def plan(self, assignment: ShardAssignment, paths: ShardPaths) -> LaunchSpec | Refused:
        """How the shard starts here, or why it cannot: an input missing, or out of reach of its user."""
        job, shard, attempt = key_of(assignment)
        try:
            missing = paths.missing()
        except (OSError, ValueError) as exc:  # one job's unreadable path fails that shard, not the handler
            missing = [f"inputs that cannot be looked at ({unreadable(exc).message})"]
        if missing:
            return Refused(FailureCause.MISSING_ARTIFACT, f"missing on {self.me.node_id}: {', '.join(missing)}")
        try:
            assignment = opened_env(assignment, self.me.env_key)
        except SecretEnvError as exc:
            return Refused(FailureCause.LAUNCH_ERROR, f"on {self.me.node_id}, entrypoint.env {exc}")
        user = self.me.shard_users.of(job)
        blocked = self.files.blocked(paths, user)
        if blocked is not None:
            return Refused(FailureCause.LAUNCH_ERROR, f"on {self.me.node_id}, {blocked}")
        # An entrypoint sees every GPU of the node (LOCAL_RANK is its own): LOCAL_WORLD_SIZE is their number.
        local_world_size = len(self.gpus.uuids()) if assignment.workload.entrypoint is not None else 1
        env = shard_env(
            assignment,
            paths,
            base_env=self.me.base_env,
            options=self.me.runner,
            local_world_size=local_world_size,
            home=self.files.home(job, user),
            user_name=None if user is None else login_name(user, lambda uid: pwd.getpwuid(uid).pw_name),
        )
        return LaunchSpec(
            argv=shard_argv(assignment, paths, python=self.me.python),
            env=tracing.child_env(env, job),  # the shard process continues the trace from the launch span
            cwd=Path.cwd(),
            log_path=self.me.log_dir / job / f"shard-{shard}-attempt-{attempt}.log",
            user=user,
        )

    async def older_attempts_gone(self, assignment: ShardAssignment) -> None:
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

    async def launch(self, spec: LaunchSpec) -> ShardProcess:
        """A cold start (OSError when it cannot start)."""
        return await self.launcher.launch(spec, progress_env=PROGRESS_FD_ENV)

    def add(self, key: ShardKey, process: ShardProcess) -> None:
        """The shard's process runs: it can be stopped and signalled from now (its watch starts with :meth:`watch`)."""
        self.processes[key] = process

    def watch(self, key: ShardKey, process: ShardProcess, log_path: Path) -> None:
        job, shard, attempt = key
        task = asyncio.create_task(self._watch(key, process, log_path), name=f"shard-{job}-{shard}-{attempt}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _watch(self, key: ShardKey, process: ShardProcess, log_path: Path) -> None:
        final: dict[str, Any] | None = None
        async for line in process.progress():
            report = _report(line)
            if report is None:
                continue
            kind = report.get("kind")
            if kind == "progress":
                await self.reports.progressed(key, report)
            elif kind == "checkpointed":
                await self.reports.checkpointed(key, report)
            elif kind in ("finished", "preempted", "failed"):
                final = report
        code = await process.wait()
        self.processes.pop(key, None)
        message = f"exit code {code}" + (f": {tail(log_path)}" if code else "")
        await self.reports.exited(key, code, message, final)

    def here(self, job_id: str) -> int:
        """How many processes of the job's shards run here."""
        return sum(1 for job, _, _ in self.processes if job == job_id)

    def pids(self) -> dict[ShardKey, int]:
        return {key: process.pid for key, process in self.processes.items()}

    def stop(self, key: ShardKey) -> bool:
        """SIGTERM now, SIGKILL after the grace period (nothing happens to a process that is gone by then); False
        when the shard has no process here."""
        process = self.processes.get(key)
        if process is None:
            return False
        process.terminate()
        asyncio.get_running_loop().call_later(TERMINATE_GRACE_S, process.kill)
        return True

    def signal(self, key: ShardKey, sig: int) -> bool:
        """Send ``sig`` to the shard's process; False when it has none here."""
        process = self.processes.get(key)
        if process is None:
            return False
        process.signal(sig)
        return True

    async def stop_all(self) -> None:
        """On shutdown: stop every shard and wait for them to exit (SIGKILL after the grace period)."""
        for process in self.processes.values():
            process.terminate()
        if self.tasks:
            _, pending = await asyncio.wait(self.tasks, timeout=TERMINATE_GRACE_S)
            for process in self.processes.values():
                process.kill()
            if pending:
                await asyncio.wait(pending, timeout=TERMINATE_GRACE_S)
