"""The chaos test's judge of a goodput ledger against the truth seen from outside (``tests.support.ledger_truth``):
it passes a ledger that matches, and names each part that is off by more than 2 % of the life."""

from pathlib import Path

from tests.support.ledger_truth import Truth, misjudged, trained_s

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
