"""What every service process shares: logging, its presence event, periodic work and the run loop."""

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence

from faststream import FastStream

from shardyard import tracing
from shardyard.bus.admin import ensure_topics
from shardyard.bus.kafka import Bus
from shardyard.bus.leadership import ElectionTimings, Leadership
from shardyard.clock import Clock, SystemClock
from shardyard.errors import ShardyardError
from shardyard.events import ServiceReady
from shardyard.metrics import serve_metrics
from shardyard.settings import ReplicatedSettings, S, load_settings

log = logging.getLogger(__name__)


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

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

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


EXIT_DEPOSED = 3
"""A standby-run service exits with this when another replica took over its leadership (its supervisor restarts it,
and it stands by again)."""


def run_main(
    settings_class: type[S],
    build_app: Callable[..., FastStream],
    *,
    prog: str,
    argv: Sequence[str] | None = None,
    service: str | None = None,
) -> int:
    """The body of every ``python -m shardyard.<service>``: load settings once, build the app, run it. With
    ``service`` (settings must then be ``ReplicatedSettings``) the process first stands by until it is elected
    that service's leader, and runs the app only while it leads."""
    try:
        settings = load_settings(settings_class, sys.argv[1:] if argv is None else argv, os.environ, prog=prog)
        configure_logging(settings.log_level)
        serve_metrics(settings.metrics_port, host=settings.metrics_host)  # standbys too: they are processes
        tracing.configure(prog, os.environ, instance=settings.instance)  # exports only when OTEL_* ask for it
        if service is not None:
            assert isinstance(settings, ReplicatedSettings), "a replicated service needs ReplicatedSettings"
            return asyncio.run(run_standby(settings, build_app, service=service, timings=settings.election_timings()))
        app = build_app(settings, clock=SystemClock())
    except ShardyardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    asyncio.run(app.run())
    return 0


async def run_standby(
    settings: ReplicatedSettings, build_app: Callable[..., FastStream], *, service: str, timings: ElectionTimings
) -> int:
    """Active/standby for services whose work is not split between replicas: stand by (announced, idle) until
    elected, then rebuild from the log and run. A leader that loses the partition and does not get it back within
    one rebalance has been replaced: it stops, and exits with ``EXIT_DEPOSED``."""
    clock = SystemClock()
    stop = asyncio.Event()
    elected, lost = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    leadership = Leadership(
        settings.bootstrap,
        service=service,
        instance=settings.instance,
        clock=clock,
        on_elected=lambda _term: _flip(lost, elected),
        on_lost=lambda: _flip(elected, lost),
        timings=timings,
    )
    await ensure_topics(settings.bootstrap)
    await leadership.start()
    try:
        log.info("%s (%s) stands by", service, settings.instance)
        if not await _first(elected.wait(), stop.wait()):
            return 0
        app = build_app(settings, clock=clock)
        running = asyncio.create_task(app.run())
        deposed = asyncio.create_task(_deposed(elected, lost, grace_s=timings.rebalance_timeout_ms / 1000 + 1.0))
        await asyncio.wait({running, deposed}, return_when=asyncio.FIRST_COMPLETED)
        code = 0
        if deposed.done() and not running.done():
            log.warning("%s (%s) was replaced as leader: stopping", service, settings.instance)
            code = EXIT_DEPOSED
            app.exit()
        deposed.cancel()
        await running
        return code
    finally:
        await leadership.stop()


def _flip(off: asyncio.Event, on: asyncio.Event) -> None:
    off.clear()
    on.set()


async def _first(wanted: Awaitable[object], stop: Awaitable[object]) -> bool:
    """Whether ``wanted`` completed before ``stop``."""
    tasks = {asyncio.ensure_future(wanted): True, asyncio.ensure_future(stop): False}
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return any(tasks[task] for task in done)


async def _deposed(elected: asyncio.Event, lost: asyncio.Event, *, grace_s: float) -> None:
    """Return once leadership was lost and not regained within ``grace_s`` (a rebalance hands it straight back)."""
    while True:
        await lost.wait()
        try:
            async with asyncio.timeout(grace_s):  # not wait_for: on 3.11 it can swallow a cancellation
                await elected.wait()
        except TimeoutError:
            return
