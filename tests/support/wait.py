"""Waiting in tests: for a condition, with a deadline, never a bare sleep.

One loop, in a plain and an async form. ``probe`` answers falsy until the condition holds; its first truthy answer is
returned. An exception of a type in ``tolerate`` (a 404 before the monitor saw a job, a server not listening yet)
counts as "not yet". When time runs out the test fails with ``what`` and, if given, ``describe()`` (what was seen).
"""

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

Probe = Callable[[], T | None]


class _Deadline:
    def __init__(self, what: str, timeout_s: float, describe: Callable[[], object] | None) -> None:
        self.what, self.timeout_s, self.describe = what, timeout_s, describe
        self.at = time.monotonic() + timeout_s

    def passed(self) -> bool:
        return time.monotonic() > self.at

    def fail(self) -> AssertionError:
        seen = f" {self.describe()}" if self.describe is not None else ""
        return AssertionError(f"timed out after {self.timeout_s:g} s waiting for {self.what}.{seen}")


def until(
    probe: Callable[[], T | None],
    what: str,
    timeout_s: float,
    *,
    every_s: float = 0.05,
    tolerate: tuple[type[BaseException], ...] = (),
    describe: Callable[[], object] | None = None,
) -> T:
    """``probe``'s first truthy answer within ``timeout_s``, checking every ``every_s``."""
    deadline = _Deadline(what, timeout_s, describe)
    while True:
        try:
            found = probe()
        except tolerate:
            found = None
        if found:
            return found
        if deadline.passed():
            raise deadline.fail()
        time.sleep(every_s)


async def eventually(
    probe: Callable[[], T | None] | Callable[[], Awaitable[T | None]],
    what: str,
    timeout_s: float,
    *,
    every_s: float = 0.05,
    tolerate: tuple[type[BaseException], ...] = (),
    describe: Callable[[], object] | None = None,
) -> T:
    """The async form of :func:`until`: ``probe`` may be a plain or an async function; the loop yields while it
    waits, so the code under test runs."""
    deadline = _Deadline(what, timeout_s, describe)
    while True:
        try:
            found = probe()
            if inspect.isawaitable(found):
                found = await found
        except tolerate:
            found = None
        if found:
            return found  # type: ignore[return-value]
        if deadline.passed():
            raise deadline.fail()
        await asyncio.sleep(every_s)
