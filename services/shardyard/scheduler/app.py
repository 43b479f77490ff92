"""Wiring of the scheduler service: replicas that follow the state topics, one of them elected leader."""

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Literal

from faststream import FastStream
from pydantic import Field

from shardyard.bus.admin import ensure_topics
from shardyard.bus.follow import Follower
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.leadership import Leadership
from shardyard.bus.quirks import fetch_wait_ms
from shardyard.bus.topics import LIFECYCLE, LINKS, NODE_STATE, QUEUES, REDUNDANCY, SHARD_EVENTS
from shardyard.clock import Clock
from shardyard.placement.model import Policy
from shardyard.queues_file import POLL_S, QueuesWatch
from shardyard.scheduler.book import SchedulerBook
from shardyard.scheduler.elasticity import ElasticityTracker
from shardyard.scheduler.exclusions import DEFAULT_HEAL_S
from shardyard.scheduler.handlers import SchedulerHandlers
from shardyard.service import Periodic, announce
from shardyard.settings import ReplicatedSettings

SERVICE = "scheduler"
FOLLOWED = (LIFECYCLE, SHARD_EVENTS, NODE_STATE, REDUNDANCY, LINKS, QUEUES)
UNREAD = frozenset({"job.accepted", "job.rejected", "job.unschedulable", "job.waiting", "shard.progress"})
"""Followed facts the scheduler never applies (``BookFacts.apply``, ``SchedulerHandlers``): passed over undecoded. A
burst's acceptances carry whole specs, and a running job's progress reports come every few seconds."""
TAKE_OVER_RETRY_S = (0.5, 10.0)
"""A take-over that failed (the broker too busy to answer, a book that could not be rebuilt) is tried again after
the first of these, doubling up to the second, for as long as the replica is elected."""

log = logging.getLogger(__name__)


class SchedulerSettings(ReplicatedSettings):
    """The scheduler: gang placement of ready jobs on nodes. Run two or more replicas; one leads."""

    checkpoint_root: str = "/data/checkpoints"
    cycle_interval_s: float = Field(default=1.0, gt=0)
    load_threshold: float = Field(default=0.5, gt=0, description="nodes at or above this CPU load take no shards")
    disk_floor_bytes: int = Field(
        default=Policy.disk_floor_bytes, ge=0, description="nodes whose output disk has less free space take no shards"
    )
    order: Literal["las", "aging"] = Field(
        default="las",
        description="queue order: las (priority, then least attained GPU-time, then oldest) or aging (priority plus "
        "aging, then oldest)",
    )
    aging_per_minute: float = Field(
        default=1.0, ge=0, description="order aging: priority a pending job gains per minute waited"
    )
    min_runtime_s: float = Field(
        default=600.0, ge=0, description="order las: how long a gang runs before a job of its priority may preempt it"
    )
    starve_factor: float = Field(
        default=2.0, gt=0, description="order las: a job that waited this many times its run time is first again"
    )
    backfill: bool = Field(
        default=True, description="let a job expected to end before a reservation starts use the reserved nodes"
    )
    reservations: int = Field(default=1, ge=0, description="blocked jobs that hold a reservation against backfill")
    start_estimates: int = Field(
        default=100, ge=0, description="jobs waiting on capacity, in queue order, given an estimated start each cycle"
    )
    preemption: bool = Field(default=True, description="preempt lower-priority preemptible jobs to fit higher ones")
    preempt_deadline_s: float = Field(
        default=30.0,
        gt=0,
        description="the preemption notice: a preempted gang checkpoints and stops within this long, or is revoked; "
        "its shards are told it (SHARDYARD_NOTICE_S)",
    )
    start_deadline_s: float = Field(
        default=60.0, gt=0, description="revoke a shard not reported started this long after its assignment"
    )
    reservation_grace_s: float = Field(
        default=30.0,
        gt=0,
        description="past its start deadline, revoke (ORPHANED) a shard its node has not reported running this long; "
        "nodes report their running shards on change and every 10 s",
    )
    spare_grace_s: float = Field(default=2.0, ge=0, description="how long a new gang waits for room for its spares")
    exclusion_heal_s: float = Field(
        default=DEFAULT_HEAL_S,
        ge=0,
        description="a node excluded from a job after a failure there is used again once ALIVE this long",
    )
    unschedulable_after_s: float = Field(
        default=3600.0,
        ge=0,
        description="end a job FAILED UNSCHEDULABLE once no set of the cluster's nodes could hold it (NEVER_FITS) "
        "for this long; 0: such a job waits for capacity for ever",
    )
    resize_cooldown_s: float = Field(
        default=30.0,
        ge=0,
        description="an elastic gang grows into free GPUs only once its attempt (its start, or its last resize or "
        "recovery) is this old: no flapping",
    )
    capacity_repeat_s: float = Field(default=30.0, gt=0, description="repeat an unchanged capacity request after")
    reclaim_after_s: float = Field(default=300.0, gt=0, description="idle time before a node is a reclaim candidate")
    queues_file: str | None = Field(
        default=None,
        description="the teams' queues (YAML, see examples/queues.yaml): read again on change and published on the "
        "queues topic; without it the queues in force are the topic's (none: one queue, no quotas)",
    )

    def policy(self) -> Policy:
        return Policy(
            load_threshold=self.load_threshold,
            order=self.order,
            aging_per_minute=self.aging_per_minute,
            min_runtime_s=self.min_runtime_s,
            starve_factor=self.starve_factor,
            backfill=self.backfill,
            reservations=self.reservations,
            preemption=self.preemption,
            start_estimates=self.start_estimates,
            disk_floor_bytes=self.disk_floor_bytes,
        )

    def new_book(self) -> SchedulerBook:
        return SchedulerBook(
            checkpoint_root=self.checkpoint_root,
            policy=self.policy(),
            preempt_deadline_s=self.preempt_deadline_s,
            start_deadline_s=self.start_deadline_s,
            reservation_grace_s=self.reservation_grace_s,
            spare_grace_s=self.spare_grace_s,
            exclusion_heal_s=self.exclusion_heal_s,
            unschedulable_after_s=self.unschedulable_after_s,
            resize_cooldown_s=self.resize_cooldown_s,
            elasticity=ElasticityTracker(repeat_s=self.capacity_repeat_s, reclaim_after_s=self.reclaim_after_s),
        )


class SchedulerReplica:
    """Follows the state topics into its book from start-up (a warm standby); decides once elected and caught up.
    A replica whose book went ahead of the log (decisions it could not publish) rebuilds it before leading: at its
    next election, or at once while it is still elected. A take-over that fails is retried while elected: an elected
    replica that does not lead leaves the service without a leader."""

    def __init__(self, settings: SchedulerSettings, bus: Bus, clock: Clock) -> None:
        self.settings = settings
        self.bus = bus
        self.clock = clock
        self.handlers = SchedulerHandlers(
            settings.new_book(), bus, clock, confirm=self._confirm, on_diverged=self._diverged
        )
        self.leadership = Leadership(
            settings.bootstrap,
            service=SERVICE,
            instance=settings.instance,
            clock=clock,
            on_elected=self._elected,
            on_lost=self._lost,
            timings=settings.election_timings(),
        )
        self.follower = self._follower()
        self.ticker = Periodic("scheduler-cycle", settings.cycle_interval_s, self.handlers.tick)
        self.queues_watch = self._queues_watch()
        self._stale = False
        self._turn = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def _queues_watch(self) -> Periodic | None:
        if self.settings.queues_file is None:
            return None
        who = f"{SERVICE}-{self.settings.instance}"
        watch = QueuesWatch(self.settings.queues_file, self.bus, self.clock, in_force=self._queues_in_force, who=who)
        return Periodic("queues-file", POLL_S, watch.tick)

    def _queues_in_force(self) -> str | None:
        configured = self.handlers.book.queues
        return None if configured is None else configured.version

    async def _watch_queues(self, watch: Periodic) -> None:
        await self.follower.caught_up()  # the configuration in force read first: an unchanged file is not news
        watch.start()

    def _follower(self) -> Follower:
        return Follower(
            self.settings.bootstrap,
            FOLLOWED,
            self.handlers.handle,
            name=f"{SERVICE}-follower",
            fetch_max_wait_ms=fetch_wait_ms(job_path=True),  # ready jobs, shard ends and node states: the job's path
            after_batch=self.handlers.flush,
            unread=UNREAD,
        )

    async def start(self) -> None:
        await self.follower.start()
        await self.leadership.start()
        self.ticker.start()
        if self.queues_watch is not None:
            self._spawn(self._watch_queues(self.queues_watch))

    async def stop(self) -> None:
        await self.ticker.stop()
        if self.queues_watch is not None:
            await self.queues_watch.stop()
        await self.leadership.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.handlers.drain()
        await self.follower.stop()

    async def _confirm(self, term: int) -> bool:
        return await self.leadership.confirm(term)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _elected(self, term: int) -> None:
        self._spawn(self._take_over(term))

    def _lost(self) -> None:
        self.handlers.leading = False

    def _diverged(self) -> None:
        self._stale = True
        term = self.leadership.term
        if term is not None:
            self._spawn(self._take_over(term))  # still elected (e.g. re-elected meanwhile): rebuild, lead again

    def _leads(self, term: int) -> bool:
        return self.handlers.leading and self.handlers.book.term == term

    async def _take_over(self, term: int) -> None:
        delay, longest = TAKE_OVER_RETRY_S
        async with self._turn:
            while self.leadership.term == term and not self._leads(term):
                try:
                    if self._stale:
                        await self._rebuild()
                    await self.follower.caught_up()  # the log to its end: every placement made before this term
                    if self.leadership.term != term:
                        return  # lost again while catching up
                    await self.handlers.take_over(term)
                    return
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("taking over as leader (term %d) failed; retrying in %.1f s", term, delay)
                    self.handlers.leading = False
                    self._stale = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, longest)

    async def _rebuild(self) -> None:
        log.info("rebuilding the scheduler's book from the log")
        await self.follower.stop()
        self.handlers.book = self.settings.new_book()
        self.follower = self._follower()
        await self.follower.start()
        self._stale = False


def build_app(settings: SchedulerSettings, *, clock: Clock) -> FastStream:
    broker = make_broker(settings.bootstrap, client_id=f"{SERVICE}-{settings.instance}")
    bus = Bus(broker, service=SERVICE)
    app = FastStream(broker)
    replica: list[SchedulerReplica] = []

    @app.on_startup
    async def topics() -> None:
        await ensure_topics(settings.bootstrap)

    @app.after_startup
    async def ready() -> None:
        replica.append(SchedulerReplica(settings, bus, clock))
        await replica[0].start()
        await announce(bus, clock, instance=settings.instance)

    @app.on_shutdown
    async def stop() -> None:
        if replica:
            await replica[0].stop()

    return app
