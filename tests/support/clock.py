"""The one fake clock of the tests: a ``shardyard.clock.Clock`` that moves only when a test moves it.

``now()`` is the wall time ``wall`` and ``monotonic()`` the seconds ``mono``; :meth:`advance` and :meth:`move_to`
move both together.
A test may also set either alone (``clock.mono = 5.0``: time passed for timers while the wall clock stood still), and
``step_s`` makes every ``monotonic()`` read advance by that much first (code that times itself between two reads).
Calling the clock returns ``monotonic()``, for code that takes a ``Callable[[], float]``.
"""

from datetime import UTC, datetime, timedelta

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class FakeClock:
    def __init__(self, wall: datetime = EPOCH, *, mono: float = 0.0, step_s: float = 0.0) -> None:
        self.wall = wall
        self.mono = mono
        self.step_s = step_s
        self._start = (wall, mono)

    def now(self) -> datetime:
        return self.wall

    def monotonic(self) -> float:
        self.mono += self.step_s
        return self.mono

    def __call__(self) -> float:
        return self.monotonic()

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)
        self.mono += seconds

    def move_to(self, seconds: float) -> None:
        """Both clocks at ``seconds`` after where they started."""
        wall, mono = self._start
        self.wall, self.mono = wall + timedelta(seconds=seconds), mono + seconds
