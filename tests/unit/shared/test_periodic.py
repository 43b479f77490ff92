"""``Periodic``: the loop of every service's periodic work (heartbeats, artifact polls, scheduling cycles) outlives a
tick that raises."""

from __future__ import annotations

import logging

import pytest

from shardyard.service import Periodic
from tests.support import wait


async def test_a_failing_tick_is_logged_and_the_next_one_runs(caplog: pytest.LogCaptureFixture) -> None:
    ticks: list[int] = []

    async def tick() -> None:
        ticks.append(len(ticks))
        if len(ticks) <= 2:
            raise OSError(36, "File name too long")

    periodic = Periodic("flaky", 0.01, tick)
    periodic.start()
    try:
        await wait.eventually(lambda: len(ticks) >= 5, "5 ticks", 5.0, every_s=0.01, describe=lambda: len(ticks))
    finally:
        await periodic.stop()

    failures = [r for r in caplog.records if r.levelno == logging.ERROR and "flaky" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info for r in failures)
