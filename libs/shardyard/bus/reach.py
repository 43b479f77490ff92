"""Whether this process reaches its broker now: a metadata request every ``every_s``, on a client of its own.

A consumer cut off from its broker reads nothing, and to a judge of silence (the resource pool) nothing read looks
like every node gone quiet at once. What it saw then says nothing of the nodes: a broker restart of a few seconds
must not turn every healthy node SUSPECT and send every running job into recovery away from it. The Kubernetes node
lifecycle controller stops evicting for the same reason when a whole zone goes NotReady at once; here the judge can
tell directly, by asking the broker itself.
"""

import asyncio
import contextlib
import logging
import time
from typing import Final

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError

from shardyard.bus.transport import client_options

log = logging.getLogger(__name__)

EVERY_S: Final = 0.25
STALE_AFTER_S: Final = 1.0
"""The broker counts as unreachable once it has not answered for this long (three probes missed, or one hung)."""


class BrokerReach:
    def __init__(self, bootstrap: str, *, name: str, every_s: float = EVERY_S, stale_after_s: float = STALE_AFTER_S):
        self.bootstrap = bootstrap
        self.name = name
        self.every_s = every_s
        self.stale_after_s = stale_after_s
        self.answered_at = time.monotonic()
        """When the broker last answered (the start counts: the process only starts once it was reached)."""
        self._task: asyncio.Task[None] | None = None
        self._client: AIOKafkaClient | None = None
        self._said_lost = False

    def reachable(self) -> bool:
        return time.monotonic() - self.answered_at < self.stale_after_s

    async def start(self) -> None:
        self._client = AIOKafkaClient(
            bootstrap_servers=self.bootstrap, client_id=f"{self.name}-reach", **client_options()
        )
        with contextlib.suppress(KafkaError, OSError):
            await self._client.bootstrap()
        self._task = asyncio.create_task(self._run(), name=f"{self.name}-reach")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            await self._client.close()

    async def _run(self) -> None:
        assert self._client is not None
        while True:
            try:
                await asyncio.wait_for(self._client.fetch_all_metadata(), self.stale_after_s)
            except (TimeoutError, KafkaError, OSError) as exc:
                if not self.reachable() and not self._said_lost:
                    self._said_lost = True
                    log.warning("%s: the broker does not answer (%s): silence judges nothing meanwhile", self.name, exc)
            else:
                self.answered_at = time.monotonic()
                if self._said_lost:
                    self._said_lost = False
                    log.warning("%s: the broker answers again", self.name)
            await asyncio.sleep(self.every_s)
