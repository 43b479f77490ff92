"""The watched queues file: a good change is published once; a bad one is refused whole, with its line and reason,
and nothing is published, so the configuration in force stays; an unchanged or already-in-force file is not news."""

import logging
from pathlib import Path

import pytest

from shardyard.queues_file import QueuesFile, version_of
from tests.support.clock import FakeClock

GOOD = "queues:\n  team-a: {gpus: {A100: 2}}\n"
BETTER = "queues:\n  team-a: {gpus: {A100: 4}}\n  team-b: {gpus: {A100: 4}}\n"
BAD = "queues:\n  team-a: {gpus: {A100: 2}}\n  team-b: {gpus: {A100: -1}}\n"


def test_a_good_change_is_published_once_and_a_bad_one_keeps_the_configuration_in_force(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, clock = tmp_path / "queues.yaml", FakeClock()
    watched = QueuesFile(path, published_by="scheduler-0")
    path.write_text(GOOD)

    first = watched.poll(None, clock)
    assert first is not None and first.version == version_of(GOOD)
    assert sorted(first.config.queues) == ["team-a"] and first.published_by == "scheduler-0"
    assert watched.poll(first.version, clock) is None  # unchanged

    path.write_text(BAD)
    with caplog.at_level(logging.ERROR):
        assert watched.poll(first.version, clock) is None
    assert watched.error is not None and watched.error.line == 3, watched.error
    assert "line 3" in caplog.text and "configuration in force stays" in caplog.text
    caplog.clear()
    assert watched.poll(first.version, clock) is None and caplog.text == ""  # refused once, not every poll

    path.write_text(BETTER)
    second = watched.poll(first.version, clock)
    assert second is not None and sorted(second.config.queues) == ["team-a", "team-b"]
    assert watched.error is None


def test_a_file_already_in_force_is_not_published_again(tmp_path: Path) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text(GOOD)

    assert QueuesFile(path, published_by="queue-1").poll(version_of(GOOD), FakeClock()) is None


def test_a_file_that_cannot_be_read_publishes_nothing_until_it_can(tmp_path: Path) -> None:
    path = tmp_path / "queues.yaml"
    watched = QueuesFile(path, published_by="queue-0")

    assert watched.poll(None, FakeClock()) is None
    assert watched.error is not None and "cannot read" in watched.error.reason

    path.write_text(GOOD)
    assert watched.poll(None, FakeClock()) is not None
