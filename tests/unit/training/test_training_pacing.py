"""Slow syncs widen the sync interval, on the gang's agreed verdict only (so ranks cannot diverge)."""

from __future__ import annotations

import pytest

from shardyard.training.pacing import MAX_MULTIPLE, SyncPacer, is_slow


@pytest.mark.parametrize(
    ("ms", "previous", "slow"),
    [
        pytest.param(100.0, [10.0, 10.0], False, id="too-little-history"),
        pytest.param(100.0, [10.0, 10.0, 10.0], True, id="ten-times-the-median"),
        pytest.param(30.0, [10.0, 10.0, 10.0], False, id="exactly-three-times"),
        pytest.param(31.0, [10.0, 10.0, 10.0], True, id="over-three-times"),
        pytest.param(100.0, [10.0, 10.0, 500.0, 10.0], True, id="median-ignores-an-outlier"),
        pytest.param(5.0, [0.5, 0.5, 0.5], False, id="jitter-below-the-floor"),
        pytest.param(11.0, [0.5, 0.5, 0.5], True, id="above-the-floor"),
    ],
)
def test_is_slow(ms: float, previous: list[float], slow: bool) -> None:
    assert is_slow(ms, previous, factor=3.0, floor_ms=10.0) is slow


def _run(pacer: SyncPacer, verdicts: list[bool], ms: float = 5.0) -> list[int | None]:
    return [pacer.observe(ms, agreed_slow=v) for v in verdicts]


def test_two_agreed_slow_syncs_in_a_row_double_the_interval() -> None:
    pacer = SyncPacer(base_interval=10, factor=3.0)

    changes = _run(pacer, [True, False, True, True, False, True])

    assert changes == [None, None, None, 20, None, None]
    assert (pacer.interval, pacer.slow_syncs, pacer.streak) == (20, 4, 1)


def test_the_interval_is_bounded() -> None:
    pacer = SyncPacer(base_interval=10, factor=3.0)

    changes = [c for c in _run(pacer, [True] * 20) if c is not None]

    assert changes == [20, 40, 80] and pacer.interval == 10 * MAX_MULTIPLE
    assert pacer.slow_syncs == 20


def test_a_widening_starts_the_history_afresh() -> None:
    pacer = SyncPacer(base_interval=10, factor=3.0)
    for _ in range(5):
        pacer.observe(2.0, agreed_slow=False)
    pacer.observe(200.0, agreed_slow=False)
    assert pacer.vote  # 200 ms against a 2 ms median
    pacer.observe(200.0, agreed_slow=True)
    assert pacer.vote

    assert pacer.observe(200.0, agreed_slow=True) == 20
    assert not pacer.vote and list(pacer.history) == []
    for _ in range(5):  # the slow pace is the norm now
        pacer.observe(200.0, agreed_slow=pacer.vote)
    assert pacer.interval == 20 and not pacer.vote


def test_ranks_that_measure_differently_still_agree() -> None:
    """Rank 0 waits for a straggling rank 1 at every sync: only rank 0 sees slow syncs. Summing the votes in the
    collective (as the control slot does) gives both the same verdict, so both widen at the same sync."""
    ranks = [SyncPacer(base_interval=10, factor=3.0), SyncPacer(base_interval=10, factor=3.0)]
    measured = [[2.0] * 5 + [150.0] * 10, [2.0] * 15]  # rank 0 waits from the 6th sync on; rank 1 never does
    intervals: list[list[int]] = [[], []]
    for sync in range(15):
        votes = sum(p.vote for p in ranks)  # what the AllReduce of the slow slot gives every rank
        for rank, pacer in enumerate(ranks):
            pacer.observe(measured[rank][sync], agreed_slow=votes > 0)
            intervals[rank].append(pacer.interval)

    assert intervals[0] == intervals[1]
    assert intervals[0][6] == 10 and intervals[0][7] == 20 and intervals[0][-1] == 20
    assert ranks[0].slow_syncs == ranks[1].slow_syncs == 2


def test_the_base_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="base_interval"):
        SyncPacer(base_interval=0, factor=3.0)


def test_gradient_averaging_is_never_widened_into_local_sgd() -> None:
    """A sync interval of 1 averages gradients; widening it would change what the job computes. Slow syncs are still
    counted (and reported), the interval stays."""
    pacer = SyncPacer(base_interval=1, factor=3.0)

    changes = _run(pacer, [True] * 10)

    assert changes == [None] * 10
    assert (pacer.interval, pacer.max_interval, pacer.slow_syncs, pacer.streak) == (1, 1, 10, 10)


@pytest.mark.parametrize(("base", "most"), [(2, 16), (10, 80)], ids=["two", "ten"])
def test_any_wider_interval_may_widen_eightfold(base: int, most: int) -> None:
    assert SyncPacer(base_interval=base, factor=3.0).max_interval == most
