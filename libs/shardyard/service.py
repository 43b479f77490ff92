"""What every service process shares: logging, its presence event, periodic work and the run loop."""

import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence

from faststream import FastStream

from shardyard import tracing
from shardyard.bus.kafka import Bus
from shardyard.clock import Clock, SystemClock
from shardyard.errors import ShardyardError
from shardyard.events import ServiceReady
from shardyard.metrics import serve_metrics
from shardyard.settings import S, load_settings

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
        serve_metrics(settings.metrics_port, host=settings.metrics_host)
        tracing.configure(prog, os.environ, instance=settings.instance)  # exports only when OTEL_* ask for it
        app = build_app(settings, clock=SystemClock())
    except ShardyardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    asyncio.run(app.run())
    return 0
