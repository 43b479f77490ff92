"""Publishing for an agent that may lose the bus: every publish has a deadline, and what must not be lost waits.

Shard starts, checkpoints and ends are *delivered*: if the bus does not take one within the deadline it is kept,
and goes out once the bus is back, in order with everything kept under the same partition key (the same event, the
same ``event_id``: consumers are idempotent, so a copy the client still sent late is harmless). One that keeps
failing holds back only the events of its own key. Heartbeats and progress are only *published*: stale ones are
worth nothing.
"""

import asyncio
import logging
from typing import Protocol

from aiokafka.errors import KafkaError

from shardyard.bus.codec import key_of, topic_of
from shardyard.events import Event

log = logging.getLogger(__name__)


class Publisher(Protocol):
    async def publish(self, event: Event) -> None: ...


class Outbox:
    def __init__(self, bus: Publisher, *, timeout_s: float) -> None:
        self.bus = bus
        self.timeout_s = timeout_s
        self.pending: list[Event] = []
        self.healthy = True
        """Whether the last publish went out."""
        self._flushing = asyncio.Lock()

    async def publish(self, event: Event) -> bool:
        """Publish within the deadline; True when the bus acknowledged it."""
        return await self._attempt(event) is None

    async def deliver(self, event: Event) -> None:
        """Publish now, or keep it (behind anything already kept) until :meth:`flush` gets it out."""
        if self.pending or not await self.publish(event):
            self.pending.append(event)

    async def flush(self) -> None:
        """Send what was kept, in order per partition key. An event the broker refuses holds back the later ones of
        its key until the next flush; one that gets no answer ends this flush (the bus is gone again)."""
        async with self._flushing:
            batch, kept = list(self.pending), []
            blocked: set[tuple[str, bytes]] = set()
            for index, event in enumerate(batch):
                route = (topic_of(event).name, key_of(event))
                error = None if route in blocked else await self._attempt(event)
                if route in blocked or error is not None:
                    blocked.add(route)
                    kept.append(event)
                if isinstance(error, TimeoutError | OSError):
                    kept.extend(batch[index + 1 :])
                    break
            self.pending = kept + self.pending[len(batch) :]  # what was delivered meanwhile stays behind

    async def _attempt(self, event: Event) -> Exception | None:
        try:
            async with asyncio.timeout(self.timeout_s):  # not wait_for: on 3.11 it can swallow a cancellation
                await self.bus.publish(event)
        except (TimeoutError, KafkaError, OSError) as exc:  # the bus was not reached (anything else is a bug: raised)
            if self.healthy:
                log.warning("the bus did not take a %s: %s: %s", type(event).__name__, type(exc).__name__, exc)
            self.healthy = False
            return exc
        self.healthy = True
        return None
