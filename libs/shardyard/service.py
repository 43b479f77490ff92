"""What every service process shares: logging, its presence event, periodic work, the run loop, and the wiring of a
service whose replicas split the work by key."""

import asyncio
import logging
import os
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from faststream import FastStream

from shardyard import tracing
from shardyard.bus import forgotten
from shardyard.bus.admin import ensure_topics
from shardyard.bus.batch import BatchHandler, RawBatchHandler
from shardyard.bus.follow import Follower, FollowHandler
from shardyard.bus.kafka import Bus, make_broker
from shardyard.bus.ownership import Assign, Ownership
from shardyard.bus.replay import remember_recent
from shardyard.bus.topics import Topic
from shardyard.clock import Clock, SystemClock
from shardyard.errors import ShardyardError
from shardyard.events import ServiceReady
from shardyard.metrics import serve_metrics
from shardyard.settings import ReplicatedSettings, S, load_settings

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 5.0
"""How long a stopping service may take to let go of the bus once its own shutdown hooks have run (its work is
stopped: an agent's shards, a replica's tickers). Committing offsets, leaving groups and flushing the producer take
well under a second with a broker; without one, aiokafka waits on it for ever, and a service told to stop must stop."""
STOP_GRACE_S = 5.0
"""How long a ``Periodic`` tick gets to end once stopped."""


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # FastStream logs every message it receives at INFO; that is noise at 1 Hz heartbeats per node.
    logging.getLogger("faststream").setLevel(logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


async def announce(bus: Bus, clock: Clock, *, instance: str) -> None:
    await bus.publish(
        ServiceReady(
            occurred_at=clock.now(), service=bus.service, instance=instance, pid=os.getpid(), host=socket.gethostname()
        )
    )


class Periodic:
    """Runs ``tick`` every ``interval_s`` seconds until stopped; a failing tick is logged, never fatal."""

    def __init__(self, name: str, interval_s: float, tick: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.interval_s = interval_s
        self._tick = tick
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Cancel the task and wait for it, ``grace_s`` at most: a tick whose cancellation was lost (Python 3.11's
        ``wait_for`` can swallow one) is cancelled again and left, so that the shutdown after it goes on."""
        if self._task:
            self._task.cancel()
            done, _ = await asyncio.wait({self._task}, timeout=grace_s)
            if not done:
                log.warning("periodic task %s did not stop within %.0f s; cancelled again and left", self.name, grace_s)
                self._task.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("periodic task %s failed", self.name)
            next_at += self.interval_s
            await asyncio.sleep(max(0.0, next_at - loop.time()))


def run_main(
    settings_class: type[S],
    build_app: Callable[..., FastStream],
    *,
    prog: str,
    argv: Sequence[str] | None = None,
) -> int:
    """The body of every ``python -m shardyard.<service>``: load settings once, build the app, run it."""
    try:
        settings = load_settings(settings_class, sys.argv[1:] if argv is None else argv, os.environ, prog=prog)
        configure_logging(settings.log_level)
        forgotten.react_with(forgotten.stop_to_start_over)
        serve_metrics(settings.metrics_port, host=settings.metrics_host)
        tracing.configure(prog, os.environ, instance=settings.instance)  # exports only when OTEL_* ask for it
        app = build_app(settings, clock=SystemClock())
    except ShardyardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bound_shutdown(app, SHUTDOWN_GRACE_S)
    asyncio.run(app.run())
    return forgotten.exit_code()


def bound_shutdown(app: FastStream, grace_s: float, *, give_up: Callable[[float], object] | None = None) -> None:
    """Once ``app``'s shutdown hooks have run (this one is registered after them), its brokers get ``grace_s`` to
    close; past that the process ends (:func:`exit_unclean`, or ``give_up``) rather than wait on an unreachable
    broker. Consumers that did not commit are read again from their last commit: every handler is idempotent."""

    @app.on_shutdown
    async def arm() -> None:
        timer = threading.Timer(grace_s, give_up or exit_unclean, args=(grace_s,))
        timer.daemon = True  # a clean exit before it fires does not wait for it
        timer.start()


def exit_unclean(grace_s: float) -> None:
    log.error("the bus was not let go of %.0f s after the service stopped (is the broker reachable?); exiting", grace_s)
    tracing.flush()
    logging.shutdown()
    os._exit(forgotten.exit_code())


@dataclass(frozen=True)
class Follow:
    """The facts every replica follows in full (see :mod:`shardyard.bus.follow`): ``handle`` gets each one, and
    ``after_batch`` is called once the records of one fetch were all handed over."""

    topics: Sequence[Topic]
    handle: FollowHandler
    after_batch: Callable[[], Awaitable[None]] | None = None
    unread: frozenset[str] = frozenset()
    """Event types ``handle`` never applies: passed over without decoding (``Follower.unread``)."""


@dataclass(frozen=True)
class Split:
    """How the replicas split the work (see :mod:`shardyard.bus.ownership`): one consumer group on the keyed
    ``topic`` gives each replica some of its partitions, and ``own`` is told which after each change (``owned``
    says which it holds now). The group reads ``routes`` (events) and ``raw_routes`` (records) in batches."""

    topic: Topic
    group: str
    own: Assign
    owned: Callable[[], frozenset[int] | None]
    who: str
    """The replica and its work, in the log line of each assignment ("queue q-0 decides the jobs")."""
    routes: Mapping[Topic, BatchHandler] = field(default_factory=dict)
    raw_routes: Mapping[Topic, RawBatchHandler] | None = None
    after_catching_up: bool = True
    """Hand partitions given over only once the follower has read every fact written before: the replica then does
    not decide again what their previous owner decided."""
    job_path: bool = False
    """Whether the group's topic is on the job's path (its fetches wait less: ``bus.quirks``)."""


def replica_bus(service: str, settings: ReplicatedSettings) -> Bus:
    """The bus of one replica of ``service``; its broker's client names the service and the instance."""
    return Bus(make_broker(settings.bootstrap, client_id=f"{service}-{settings.instance}"), service=service)


def partitioned_app(
    bus: Bus,
    settings: ReplicatedSettings,
    clock: Clock,
    *,
    follow: Follow,
    split: Split,
    ticker: Periodic | None = None,
    on_caught_up: Callable[[], None] | None = None,
) -> FastStream:
    """The app of one replica of a service whose replicas split the work by key. At start it creates the topics and
    follows ``follow`` until it has read the whole log (then ``on_caught_up``: followed facts are current from here
    on); then it joins the group of ``split``, whose members move partitions between them within one election's
    time, starts ``ticker`` and announces itself."""
    follower = Follower(
        settings.bootstrap,
        follow.topics,
        follow.handle,
        name=f"{bus.service}-{settings.instance}-follow",
        after_batch=follow.after_batch,
        unread=follow.unread,
    )
    bus.subscribe_batch(
        split.routes,
        raw_routes=split.raw_routes,
        group=split.group,
        listener=Ownership(
            split.topic,
            split.own,
            split.owned,
            who=split.who,
            caught_up=follower.caught_up if split.after_catching_up else None,
        ),
        group_options=settings.election_timings().group_options(),
        job_path=split.job_path,
    )
    app = FastStream(bus.broker)

    @app.on_startup
    async def rebuild() -> None:
        await ensure_topics(settings.bootstrap)
        await remember_recent(settings.bootstrap, bus.seal, [split.topic])  # the group resumes past what it believed
        await follower.start()
        await follower.caught_up()
        if on_caught_up is not None:
            on_caught_up()

    @app.after_startup
    async def ready() -> None:
        if ticker is not None:
            ticker.start()
        await announce(bus, clock, instance=settings.instance)

    @app.on_shutdown
    async def stop() -> None:
        if ticker is not None:
            await ticker.stop()
        await follower.stop()

    return app
