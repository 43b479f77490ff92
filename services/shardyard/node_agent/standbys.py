"""The node's warm standbys (:mod:`shardyard.training.standby`): interpreters with torch imported that a launch of
the built-in runner takes instead of starting a cold process. What is worth one, and which one a launch takes, is
decided in :mod:`.warm` (pure); this starts them, as the job's own user with its private home, hands one its
shard's order, and discards those whose time or job is over."""

import asyncio
import logging
from collections.abc import Callable, Collection
from pathlib import Path

from shardyard.clock import Clock
from shardyard.events import Event, ShardAssignment
from shardyard.node_agent.book import ShardKey, key_of
from shardyard.node_agent.environment import PROGRESS_FD_ENV, private_home
from shardyard.node_agent.identity import NodeIdentity
from shardyard.node_agent.launcher import Launcher, LaunchSpec, ShardProcess, Standby
from shardyard.node_agent.private_files import ShardFiles, give_log
from shardyard.node_agent.warm import StandbyPolicy, WarmBook
from shardyard.training import standby

log = logging.getLogger(__name__)


class Standbys:
    def __init__(
        self,
        me: NodeIdentity,
        launcher: Launcher,
        files: ShardFiles,
        clock: Clock,
        *,
        limit: int,
        job_over: Callable[[str], bool],
    ) -> None:
        self.me = me
        self.launcher = launcher
        self.files = files
        self.clock = clock
        self.policy = StandbyPolicy(me.standbys, me.standby_after_s)
        self.pool: WarmBook[Standby] = WarmBook(limit=limit, ttl_s=me.standby_ttl_s)
        self._job_over = job_over
        """Whether a job has ended (a standby that finished starting after its job's end is discarded)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = 0

    # -- what happened here: each may be worth a standby ---------------------------------------------------------

    def spare_held(self, assignment: ShardAssignment) -> None:
        if self.policy.for_spare(assignment):
            self._start(assignment.job_id)

    def launched(self, job_id: str, *, here: int) -> None:
        self.policy.launched(job_id, here=here)

    def trained(self, key: ShardKey, assignment: ShardAssignment | None, *, first: bool, here: int) -> None:
        now = self.clock.monotonic()
        if self.policy.trained(key, assignment, first=first, now=now, here=here, have=self.pool.count(key[0])):
            self._start(key[0])

    def shard_ended(self, key: ShardKey, assignment: ShardAssignment | None, event: Event | None) -> None:
        if self.policy.ended(key, assignment, event, have=self.pool.count(key[0])):
            self._start(key[0])

    def job_ended(self, job_id: str) -> None:
        self.policy.job_ended(job_id)
        for warm in self.pool.ended(job_id):
            warm.discard()

    # -- the pool ----------------------------------------------------------------------------------------------

    async def take(self, assignment: ShardAssignment, spec: LaunchSpec) -> ShardProcess | None:
        """The job's warm standby, given the shard's order; None when there is none (or it died: start cold)."""
        if assignment.workload.entrypoint is not None:
            return None
        while (warm := self.pool.take(assignment.job_id)) is not None:
            give_log(spec.log_path, spec.user)  # the standby opens it itself, as the job's user
            try:
                process = await warm.go(standby.Order(env=spec.env, log=str(spec.log_path)).encode())
            except OSError as exc:
                log.warning("the standby for %s is gone (%s): trying the next", key_of(assignment), exc)
                continue
            log.info("%s: started from warm standby %d", key_of(assignment), process.pid)
            return process
        return None

    def expire(self, holding: Collection[str]) -> None:
        """Discard the standbys past their time (their job holds nothing here: ``holding``) and forget the dead."""
        for warm in self.pool.expired(self.clock.monotonic(), holding):
            warm.discard()
        for warm in self.pool.dead(lambda w: w.alive()):
            log.warning("standby %d ended by itself", warm.pid)
            warm.discard()  # reaps it

    def stop(self) -> None:
        """On shutdown: no more standbys, and those here are discarded."""
        for task in self._tasks:
            task.cancel()
        for warm in self.pool.clear():
            warm.discard()

    def _start(self, job_id: str) -> None:
        if not self.pool.room():
            return
        self.pool.reserve(job_id)
        task = asyncio.create_task(self._warm_up(job_id), name=f"standby-{job_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _warm_up(self, job_id: str) -> None:
        self._started += 1
        user = self.me.shard_users.of(job_id)
        home = self.files.home(job_id, user)
        spec = LaunchSpec(
            argv=(self.me.python, "-m", standby.MODULE),
            env={**self.me.runner.net_env(), **self.me.base_env, "OMP_NUM_THREADS": "1", **private_home(home)},
            cwd=Path.cwd(),
            log_path=self.me.log_dir / job_id / f"standby-{self.me.node_id}-{self._started}.log",
            user=user,
        )
        try:
            self.files.prepare_standby(job_id, spec.log_path, user)
            warm = await self.launcher.standby(spec, progress_env=PROGRESS_FD_ENV)
        except OSError as exc:
            log.warning("cannot start a standby for %s: %s", job_id, exc)
            return
        finally:
            self.pool.unreserve(job_id)
        if self._job_over(job_id):
            warm.discard()  # the job ended while it started
            return
        self.pool.add(job_id, warm, now=self.clock.monotonic())
        log.info("standby %d warming up for %s", warm.pid, job_id)
