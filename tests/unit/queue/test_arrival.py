"""A submission was made when its record reached the log (``shardyard.queue.arrival``): never later than it is read,
and never believed more than a day earlier (a producer's own clock, on the embedded broker)."""

from datetime import timedelta

from shardyard.queue.arrival import MAX_SUBMISSION_AGE, submitted_when
from tests.unit.builders import at


def test_a_record_read_late_counts_from_its_append() -> None:
    assert submitted_when(at(10), at(25)) == at(10)


def test_no_later_than_it_is_read_nor_earlier_than_a_day_before() -> None:
    assert submitted_when(at(30), at(25)) == at(25)  # a clock ahead of the reader's
    assert submitted_when(at(0) - timedelta(days=3), at(0)) == at(0) - MAX_SUBMISSION_AGE


def test_a_record_without_a_time_counts_from_its_reading() -> None:
    assert submitted_when(None, at(7)) == at(7)
