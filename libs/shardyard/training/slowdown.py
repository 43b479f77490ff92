"""Test-only hooks: a node made slower, as a slower GPU or a slower network would make it (fault injection for the
straggler tests and ``bench/straggler.py``). Off in every real run.

They are on only when the process's environment names a directory in ``SHARDYARD_TEST_SLOWDOWN_DIR`` (the agent
passes its own environment on to the runners it starts). Each file there is read at most once a second, so a test
turns a slow-down on and off while the shards train:

- ``<dir>/<node id>`` holds a factor (``2`` is half speed): the own part (forward, backward: before the gang's
  collective) of each step of every shard on that node (``SHARDYARD_NODE_ID``) lasts that many times as long: the
  runner sleeps for the difference (:class:`Slowdown`).
- ``<dir>/<node id>.link`` holds milliseconds: that node's network is that much slower a round trip. Each sync of a
  shard there waits that long before its AllReduce, inside the sync (the gang waits on it there, as on a slow link),
  and the node agent's link probes to or from that node take that long more a round trip (:class:`LinkDelay`).

Nothing else changes: the agent, the progress reports, the link measurements and the gang see a rank whose steps
take longer, or a link that answers later, as on slow hardware.
"""

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

SLOWDOWN_DIR_ENV: Final = "SHARDYARD_TEST_SLOWDOWN_DIR"
READ_EVERY_S: Final = 1.0
LINK_SUFFIX: Final = ".link"


class _Setting:
    """One hook file's number, read again at most once a second; ``default`` while there is no file (or no number)."""

    def __init__(self, path: Path | None, default: float, clock: Callable[[], float]) -> None:
        self.path, self.default, self.value = path, default, default
        self._clock = clock
        self._read_at: float | None = None

    def read(self) -> float:
        if self.path is None:
            return self.default
        now = self._clock()
        if self._read_at is None or now - self._read_at >= READ_EVERY_S:
            self._read_at = now
            try:
                self.value = float(self.path.read_text().strip() or self.default)
            except (OSError, ValueError):
                self.value = self.default
        return self.value


def _folder(environ: Mapping[str, str] | None) -> Path | None:
    folder = (os.environ if environ is None else environ).get(SLOWDOWN_DIR_ENV)
    return Path(folder) if folder else None


class Slowdown:
    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        env = os.environ if environ is None else environ
        folder, node_id = _folder(env), env.get("SHARDYARD_NODE_ID", "")
        self.path = None if folder is None or not node_id else folder / node_id
        self._factor = _Setting(self.path, 1.0, clock)
        self._sleep = sleep

    @property
    def factor(self) -> float:
        return max(1.0, self._factor.value)

    def stretch(self, own_s: float) -> None:
        """After ``own_s`` of a step's own part: sleep so that it lasts ``factor`` times as long."""
        if self.path is None:
            return
        self._factor.read()
        if self.factor > 1.0:
            self._sleep(own_s * (self.factor - 1.0))


class LinkDelay:
    """The ``.link`` files: how much slower a round trip over a node's network is (seconds; 0 without the hook)."""

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        env = os.environ if environ is None else environ
        self.folder, self.node_id = _folder(env), env.get("SHARDYARD_NODE_ID", "")
        """This process's node (a shard's), which :meth:`wait` slows."""
        self._clock, self._sleep = clock, sleep
        self._nodes: dict[str, _Setting] = {}

    def of(self, node_id: str) -> float:
        """The extra seconds a round trip to or from ``node_id`` takes."""
        if self.folder is None or not node_id:
            return 0.0
        setting = self._nodes.get(node_id)
        if setting is None:
            setting = self._nodes[node_id] = _Setting(self.folder / f"{node_id}{LINK_SUFFIX}", 0.0, self._clock)
        return max(0.0, setting.read()) / 1000.0

    def between(self, a: str, b: str) -> float:
        """The extra seconds a round trip between two nodes takes: the slower end's."""
        return max(self.of(a), self.of(b))

    def wait(self) -> float:
        """Before a sync of a shard: sleep its node's extra round trip; the seconds slept."""
        delay = self.of(self.node_id)
        if delay > 0:
            self._sleep(delay)
        return delay
