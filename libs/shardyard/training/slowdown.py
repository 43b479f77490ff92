"""A test-only hook: a node made slower, as a slower GPU would make it (fault injection for the straggler tests and
``bench/straggler.py``). Off in every real run.

It is on only when the shard's environment names a directory in ``SHARDYARD_TEST_SLOWDOWN_DIR`` (the agent passes
its own environment on to the runners it starts). Then, while the file ``<dir>/<node id>`` holds a factor (``2`` is
half speed), the own part (forward, backward: before the gang's collective) of each step of every shard on that node
(``SHARDYARD_NODE_ID``) lasts that many times as long: the runner sleeps for the difference. The file is read at most
once a second, so a test turns the slow-down on and off while the shard trains. Nothing else changes: the agent, the
progress reports and the gang see a rank whose steps take longer, as on slow hardware.
"""

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

SLOWDOWN_DIR_ENV: Final = "SHARDYARD_TEST_SLOWDOWN_DIR"
READ_EVERY_S: Final = 1.0


class Slowdown:
    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        env = os.environ if environ is None else environ
        folder, node_id = env.get(SLOWDOWN_DIR_ENV), env.get("SHARDYARD_NODE_ID", "")
        self.path = None if not folder or not node_id else Path(folder) / node_id
        self.factor = 1.0
        self._clock, self._sleep = clock, sleep
        self._read_at: float | None = None

    def stretch(self, own_s: float) -> None:
        """After ``own_s`` of a step's own part: sleep so that it lasts ``factor`` times as long."""
        if self.path is None:
            return
        now = self._clock()
        if self._read_at is None or now - self._read_at >= READ_EVERY_S:
            self._read_at = now
            try:
                self.factor = max(1.0, float(self.path.read_text().strip() or 1.0))
            except (OSError, ValueError):
                self.factor = 1.0
        if self.factor > 1.0:
            self._sleep(own_s * (self.factor - 1.0))
