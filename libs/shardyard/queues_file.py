"""The queues file, watched: read again whenever it changes, and published on the queues topic when it is good.

The queue and the scheduler services take ``--queues-file``. Each replica polls the file (``POLL_S``) and, when its
text is new to it and differs from the configuration on the topic, publishes it (``QueuesConfigured``); a replica that
reads the same text as the one in force publishes nothing. A file that does not parse, or does not validate, is
refused whole: the replica logs its line and the reason, and the configuration in force stays (nothing on the topic
changes). Every replica and the monitor apply what the topic holds, so they agree whichever replica read the file.
"""

import hashlib
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from shardyard.clock import Clock
from shardyard.events import QueuesConfigured
from shardyard.quotas import QueuesConfig, QueuesFileError, parse_queues

if TYPE_CHECKING:
    from shardyard.bus.kafka import Bus  # aiokafka: not loaded by the commands that only read a queues file

log = logging.getLogger(__name__)

POLL_S = 2.0
"""How often a service reads its queues file again: a change is in force within this, plus one cycle."""


def version_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def read_queues(path: Path) -> tuple[QueuesConfig, str]:
    """The configuration in the file at ``path`` and its version; raises :class:`QueuesFileError` (line and reason)
    for a bad file, and for one that cannot be read."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise QueuesFileError(0, f"cannot read {path}: {error}") from None
    return parse_queues(text), version_of(text)


class QueuesFile:
    """What to publish after each read of one queues file (pure but for the read)."""

    def __init__(self, path: Path, *, published_by: str) -> None:
        self.path = path
        self.published_by = published_by
        self._seen: str | None = None
        """The version of the text last read (good or bad): a file read again unchanged is not judged again."""
        self.error: QueuesFileError | None = None
        """Why the file last read was refused (None: it was good)."""

    def poll(self, in_force: str | None, clock: Clock) -> QueuesConfigured | None:
        """The event to publish for the file as it is now, given the version ``in_force`` on the topic (None: no
        configuration yet): None when the file is unchanged since the last read, is the one in force, or is bad."""
        try:
            text = self.path.read_text()
        except (OSError, UnicodeDecodeError) as error:
            self._refuse("", QueuesFileError(0, f"cannot read it: {error}"))
            return None
        version = version_of(text)
        if version == self._seen:
            return None
        try:
            config = parse_queues(text)
        except QueuesFileError as error:
            self._refuse(version, error)
            return None
        self._seen, self.error = version, None
        if version == in_force:
            return None
        log.info("queues file %s: %d queues (version %s)", self.path, len(config.queues), version[:12])
        return QueuesConfigured(
            occurred_at=clock.now(),
            config=config,
            version=version,
            source=str(self.path),
            published_by=self.published_by,
        )

    def _refuse(self, version: str, error: QueuesFileError) -> None:
        if version != self._seen:  # logged once per bad text (or once for as long as it cannot be read)
            log.error("queues file %s refused (the configuration in force stays): %s", self.path, error)
        self._seen, self.error = version, error


class QueuesWatch:
    """Polls a queues file and publishes each good change (a ``Periodic`` calls ``tick``)."""

    def __init__(self, path: str, bus: "Bus", clock: Clock, *, in_force: Callable[[], str | None], who: str) -> None:
        self.file = QueuesFile(Path(path), published_by=f"{who}@{socket.gethostname()}")
        self.bus = bus
        self.clock = clock
        self.in_force = in_force

    async def tick(self) -> None:
        event = self.file.poll(self.in_force(), self.clock)
        if event is not None:
            await self.bus.publish(event)
