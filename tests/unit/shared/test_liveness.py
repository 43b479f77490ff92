"""Liveness on a loaded host: the margin a node's stalls ask for, the sliding worst stall, and the event loop's lag
measured for real."""

import asyncio
import time

import pytest

from shardyard.liveness import MAX_MARGIN_S, STALL_FLOOR_S, LoopLag, Stalls, margin_s


@pytest.mark.parametrize(
    ("worst", "margin"),
    [
        pytest.param(0.0, 0.0, id="idle"),
        pytest.param(STALL_FLOOR_S / 2, 0.0, id="noise-widens-nothing"),
        pytest.param(0.5, 1.0, id="twice-the-stall"),
        pytest.param(1.5, 3.0, id="a-long-stall"),
        pytest.param(30.0, MAX_MARGIN_S, id="capped-below-lost"),
    ],
)
def test_the_margin_is_twice_the_worst_stall_above_the_floor_and_capped(worst: float, margin: float) -> None:
    assert margin_s(worst) == margin


def test_the_worst_stall_is_that_of_the_last_minute() -> None:
    stalls = Stalls(window_s=60.0)
    assert stalls.worst(0.0) == 0.0
    stalls.add(0.0, 1.5)
    stalls.add(10.0, 0.3)
    stalls.add(20.0, 0.8)
    assert stalls.worst(59.0) == 1.5
    assert stalls.worst(61.0) == 0.8  # the 1.5 s stall is forgotten; 0.8 s, later and longer than 0.3 s, remains
    assert stalls.worst(81.0) == 0.0


async def test_a_blocked_loop_is_measured_as_lag() -> None:
    lag = LoopLag(every_s=0.01)
    lag.start()
    try:
        await asyncio.sleep(0.05)
        lag.take()
        time.sleep(0.3)  # noqa: ASYNC251 - the loop held on purpose, as a starved process's would be
        await asyncio.sleep(0.05)
        assert lag.take() >= 0.25
        await asyncio.sleep(0.05)
        assert lag.take() < 0.25
    finally:
        await lag.stop()
