"""Start estimates corrected by how the earlier ones erred: per class of estimated wait, the median ratio of actual
to estimated wait scales the p50, the 90th percentile of the p90's scales the p90."""

from __future__ import annotations

from datetime import timedelta

from shardyard.events import PendingReason
from shardyard.placement.calibration import StartCalibration
from shardyard.placement.model import Place, Unschedulable
from tests.unit.builders import at


def estimate(job_id: str, now_s: float, p50_s: float, p90_s: float) -> Unschedulable:
    return Unschedulable(
        job_id,
        PendingReason.INSUFFICIENT_GPUS,
        "busy",
        estimated_start=at(now_s + p50_s),
        estimated_start_p90=at(now_s + p90_s),
    )


def test_until_enough_is_known_estimates_pass_unchanged() -> None:
    calibration = StartCalibration(min_samples=3)
    (same,) = calibration.corrected([estimate("a", 0, 100, 200)], at(0))
    assert isinstance(same, Unschedulable)
    assert (same.estimated_start, same.estimated_start_p90) == (at(100), at(200))


def test_jobs_that_waited_twice_their_estimate_double_the_next_ones() -> None:
    calibration = StartCalibration(min_samples=3)
    for i, waited in enumerate((180.0, 200.0, 220.0)):  # each said 100 s (p50) and 150 s (p90)
        calibration.corrected([estimate(f"j{i}", 0, 100, 150)], at(0))
        calibration.started(f"j{i}", at(waited))

    (corrected,) = calibration.corrected([estimate("next", 1000, 100, 150)], at(1000))

    assert isinstance(corrected, Unschedulable)
    assert corrected.estimated_start == at(1000) + timedelta(seconds=200)  # the median ratio, 2.0
    assert corrected.estimated_start_p90 == at(1000) + timedelta(seconds=150 * 220 / 150)  # the highest of three


def test_a_class_of_estimated_wait_learns_apart_from_the_others() -> None:
    calibration = StartCalibration(min_samples=2)
    for i in range(2):  # estimates of a minute or less came true
        calibration.corrected([estimate(f"short{i}", 0, 30, 40)], at(0))
        calibration.started(f"short{i}", at(30))
    (long,) = calibration.corrected([estimate("long", 0, 3000, 4000)], at(0))  # another class: not known yet
    assert isinstance(long, Unschedulable) and long.estimated_start == at(3000)


def test_the_first_estimate_teaches_and_a_job_that_never_started_teaches_nothing() -> None:
    calibration = StartCalibration(min_samples=1)
    calibration.corrected([estimate("a", 0, 100, 100)], at(0))
    calibration.corrected([estimate("a", 50, 10, 10)], at(50))  # a later estimate: the first one is judged
    calibration.corrected([estimate("gone", 0, 100, 100)], at(0))
    calibration.forget("gone")
    calibration.started("gone", at(500))
    calibration.started("a", at(300))

    assert calibration.factors(100.0) == (3.0, 3.0)


def test_placements_and_other_decisions_pass_through() -> None:
    calibration = StartCalibration(min_samples=1)
    placed = Place("p", (), "n1")
    unknown = Unschedulable("u", PendingReason.INSUFFICIENT_GPUS, "busy")
    assert calibration.corrected([placed, unknown], at(0)) == [placed, unknown]
