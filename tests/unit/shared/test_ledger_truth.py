"""The chaos test's judge of a goodput ledger against the truth seen from outside (``tests.support.ledger_truth``):
it passes a ledger that matches, and names each part that is off by more than 2 % of the life."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support.ledger_truth import Truth, misjudged, step_parts, stepped, trained_s

T0 = 1_000.0


def ledger(**parts: float) -> dict[str, float]:
    names = ("queued", "productive", "recovery", "recomputed", "notice", "degraded", "straggler")
    seconds = {f"{name}_s": parts.get(name, 0.0) for name in names}
    return {**seconds, "total_s": sum(seconds.values())}


def untroubled() -> Truth:
    """Submitted at T0, its processes alive from +2 s to +102 s, training 95 s of that; ended at +103 s."""
    return Truth(T0, T0 + 103.0, spans={1: (T0 + 2.0, T0 + 102.0)}, trained_s={1: 95.0})


def test_a_ledger_that_matches_the_truth_holds() -> None:
    assert misjudged(ledger(queued=2.1, recovery=4.6, productive=96.5), untroubled()) == {}  # the end's lag: 1 s


def test_each_part_off_by_more_than_two_percent_of_the_life_is_named() -> None:
    off = misjudged(ledger(queued=5.0, recovery=1.0, productive=96.5, notice=0.5), untroubled())
    assert set(off) == {"queued", "recovery"}  # the notice's 0.5 s is within 2 % of 103 s
    assert set(misjudged(ledger(queued=2.0, recovery=1.0, productive=97.0, notice=3.0), untroubled())) >= {"notice"}
    assert "total" in misjudged(ledger(queued=2.0, recovery=5.0, productive=93.0), untroubled())  # 100 s of 103


def test_parts_that_do_not_add_up_to_the_total_are_named() -> None:
    broken = {**ledger(queued=2.0, recovery=5.0, productive=96.0), "total_s": 110.0}
    assert "sum" in misjudged(broken, untroubled())


def test_a_fault_gap_counted_as_training_is_named() -> None:
    # Attempt 1 alive +2..+40 s, nothing alive until +60 s, attempt 2 until +120 s: 20 s with no process.
    truth = Truth(T0, T0 + 120.0, spans={1: (T0 + 2.0, T0 + 40.0), 2: (T0 + 60.0, T0 + 120.0)})
    assert misjudged(ledger(queued=2.0, recovery=25.0, recomputed=3.0, productive=90.0), truth) == {}
    off = misjudged(ledger(queued=2.0, recovery=5.0, recomputed=3.0, productive=110.0), truth)
    assert {"recovery+queued", "productive+recomputed"} <= set(off)


def test_the_training_time_is_read_from_each_shards_closing_line(tmp_path: Path) -> None:
    line = "shard: trained steps {a}..{b}, {n} steps in {s} s after the first: 9.99 steps/s\n"
    (tmp_path / "shard-0-attempt-1.log").write_text("noise\n" + line.format(a=1, b=600, n=599, s="61.250"))
    (tmp_path / "shard-1-attempt-1.log").write_text(line.format(a=1, b=600, n=599, s="62.500"))
    (tmp_path / "shard-0-attempt-2.log").write_text("killed before its end\n")
    assert trained_s(tmp_path, 1) == 62.5
    assert trained_s(tmp_path, 2) is None


def test_each_shards_step_lines_are_read_with_their_times(tmp_path: Path) -> None:
    line = "shardyard.training[rank {r}/2]: step {s}/300 loss 2.5 syncs 1 at 2026-12-07T16:15:2{t}.250000Z\n"
    (tmp_path / "shard-0-attempt-1.log").write_text(line.format(r=0, s=1, t=1) + "noise\n" + line.format(r=0, s=2, t=2))
    (tmp_path / "shard-1-attempt-1.log").write_text(line.format(r=1, s=1, t=3))
    (tmp_path / "shard-0-attempt-2.log").write_text("killed before its first step\n")
    t0 = datetime(2026, 12, 7, 16, 15, 20, 250000, tzinfo=UTC).timestamp()
    assert stepped(tmp_path, 1) == {0: [(t0 + 1, 1), (t0 + 2, 2)], 1: [(t0 + 3, 1)]}
    assert stepped(tmp_path, 2) == {}


def test_the_step_lines_give_every_part_of_a_faulted_job() -> None:
    """Submitted at 0, placed at 1. Attempt 1: rank 0 steps 1..40 from 3 to 7, rank 1 from 4 to 6.8 (its last, 39);
    a fault; attempt 2 resumes at step 31: rank 0 from 20, rank 1 from 21 (the gang's first step), each passing
    step 40 (attempt 1's high) at 22 and 23 (the gang caught up), its last step at 30; the job ends at 31."""

    def lines(first: float, last: float, steps: range) -> list[tuple[float, int]]:
        pace = (last - first) / (len(steps) - 1)
        return [(first + pace * i, step) for i, step in enumerate(steps)]

    attempts = {
        1: {0: lines(3, 7, range(1, 41)), 1: lines(4, 6.8, range(1, 40))},
        2: {0: [(20.0, 31), (22.0, 40), (30.0, 60)], 1: [(21.0, 31), (23.0, 40), (29.0, 60)]},
    }
    parts = step_parts(0.0, 1.0, 31.0, attempts)
    assert parts == pytest.approx(
        {
            "queued": 1.0,
            "productive": (7 - 4) + (31 - 23),
            "recomputed": 23 - 21,
            "recovery": 31 - 1 - 3 - 8 - 2,
            "notice": 0.0,
            "degraded": 0.0,
            "straggler": 0.0,
        }
    )
    truth = Truth(T0, T0 + 31.0, spans={1: (T0 + 1.2, T0 + 8.0), 2: (T0 + 19.0, T0 + 30.5)}, placed=T0 + 1.0)
    truth.steps = {
        n: {r: [(T0 + at, s) for at, s in rank] for r, rank in shards.items()} for n, shards in attempts.items()
    }
    assert misjudged(ledger(queued=1.0, recovery=17.0, recomputed=2.0, productive=11.0), truth) == {}
    off = misjudged(
        ledger(queued=1.0, recovery=17.0, recomputed=0.0, productive=13.0), truth
    )  # redone steps counted as new
    assert set(off) == {"recomputed", "productive"}


def test_a_straggler_found_on_a_loaded_host_is_judged_with_the_productive_time() -> None:
    """Steps from +2 s to +52 s, the job's end at +53 s: 51 s of training, however the detector split it."""
    truth = Truth(T0, T0 + 53.0, spans={1: (T0 + 1.5, T0 + 52.5)}, placed=T0 + 1.0)
    truth.steps = {1: {0: [(T0 + 2.0, 1), (T0 + 52.0, 300)]}}
    assert misjudged(ledger(queued=1.0, recovery=1.0, productive=41.0, straggler=10.0), truth) == {}
    assert misjudged(ledger(queued=1.0, recovery=1.0, productive=31.0, straggler=20.0), truth) == {}
    off = misjudged(ledger(queued=1.0, recovery=11.0, productive=31.0, straggler=10.0), truth)
    assert set(off) == {"recovery", "productive+straggler"}


def test_queued_ends_at_the_first_placement_not_when_the_processes_appear() -> None:
    """Placed at +1 s; the agent started the shards 1.4 s later (a loaded host): that start is the attempt's, not the
    queue's (the chaos test once saw exactly this, a 64 s life)."""
    truth = Truth(T0, T0 + 64.0, spans={1: (T0 + 2.4, T0 + 63.5)}, placed=T0 + 1.0)
    truth.steps = {1: {0: [(T0 + 3.0, 1), (T0 + 63.0, 600)]}}
    assert misjudged(ledger(queued=1.0, recovery=3.0, productive=60.0), truth) == {}
    assert "queued" in misjudged(ledger(queued=2.4, recovery=1.6, productive=60.0), truth)  # the start counted queued
