from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from shardyard.training.progress import ProgressReporter, StepLog
from tests.support.clock import FakeClock


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        with contextlib.suppress(OSError):
            os.close(fd)


def _lines(read_fd: int) -> list[dict[str, Any]]:
    data = b""
    while chunk := os.read(read_fd, 65536):
        data += chunk
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.decode().splitlines()]


def _step(reporter: ProgressReporter, step: int, loss: float, force: bool = False) -> bool:
    return reporter.progress(
        step=step, loss=loss, samples=8 * step, allreduce_ms=1.5, allreduce_bytes=1024, syncs=step // 10, force=force
    )


def test_rate_limiting_windows_and_forced_lines(pipe: tuple[int, int]) -> None:
    r, w = pipe
    wall, cpu = FakeClock(mono=100.0), FakeClock(mono=10.0)
    reporter = ProgressReporter(w, min_interval_s=0.5, clock=wall, cpu_clock=cpu)
    reporter.started(world_size=2, rank=1)

    wall.mono, cpu.mono = 101.0, 10.5
    assert _step(reporter, 1, 5.0)  # first progress line is always written
    wall.mono = 101.2
    assert not _step(reporter, 2, 4.0)  # within 0.5 s: suppressed
    wall.mono = 101.4
    assert not _step(reporter, 3, 3.0)
    wall.mono, cpu.mono = 101.5, 10.75
    assert _step(reporter, 4, 2.0)  # 0.5 s after the previous line
    wall.mono = 101.6
    assert _step(reporter, 10, 1.0, force=True)  # a sync step forces a line
    reporter.finished(final_loss=1.0, steps=10, checkpoint_dir="/out/ckpt")
    reporter.close()

    lines = _lines(r)
    assert [line["kind"] for line in lines] == ["started", "progress", "progress", "progress", "finished"]
    assert lines[0] == {"kind": "started", "world_size": 2, "rank": 1}
    first, second, forced = lines[1:4]
    assert set(first) == {
        "kind",
        "step",
        "loss",
        "samples_per_s",
        "allreduce_ms",
        "allreduce_bytes",
        "syncs",
        "cpu_percent",
        "slow_syncs",
        "step_ms",
        "compute_ms",
        "at",
    }
    assert (first["step"], first["loss"]) == (1, 5.0)
    assert first["samples_per_s"] == pytest.approx(8 / 1.0)  # since construction at t=100
    assert first["cpu_percent"] == pytest.approx(50.0)
    assert second["step"] == 4
    assert second["loss"] == pytest.approx((4.0 + 3.0 + 2.0) / 3)  # mean over the suppressed steps too
    assert second["samples_per_s"] == pytest.approx(24 / 0.5)
    assert second["cpu_percent"] == pytest.approx(50.0)
    assert (forced["step"], forced["syncs"], forced["allreduce_bytes"]) == (10, 1, 1024)
    assert lines[4] == {"kind": "finished", "final_loss": 1.0, "steps": 10, "checkpoint_dir": "/out/ckpt"}


def test_a_line_gives_the_windows_wall_and_own_time_per_step(pipe: tuple[int, int]) -> None:
    r, w = pipe
    wall = FakeClock(mono=100.0)
    reporter = ProgressReporter(w, min_interval_s=1.0, clock=wall)
    compute = 0.0
    for step in range(1, 12):  # 0.2 s a step, of which 0.05 s its own (the rest a wait on the gang)
        wall.mono, compute = 100.0 + 0.2 * step, compute + 0.05
        reporter.progress(
            step=step, loss=1.0, samples=2 * step, allreduce_ms=0.0, allreduce_bytes=0, syncs=step, compute_s=compute
        )
    reporter.close()
    first, *later = [line for line in _lines(r) if line["kind"] == "progress"]
    assert first["compute_ms"] == pytest.approx(50.0)  # the attempt's first step: its own time, start-up aside
    assert [(line["step"], round(line["step_ms"]), round(line["compute_ms"])) for line in later] == [
        (6, 200, 50),
        (11, 200, 50),
    ]


def test_non_finite_loss_is_reported_as_null(pipe: tuple[int, int]) -> None:
    r, w = pipe
    reporter = ProgressReporter(w, clock=FakeClock(mono=100.0))
    _step(reporter, 1, math.nan)
    reporter.finished(final_loss=math.inf, steps=1, checkpoint_dir=None)
    reporter.close()
    lines = _lines(r)
    assert lines[0]["loss"] is None
    assert lines[1] == {"kind": "finished", "final_loss": None, "steps": 1, "checkpoint_dir": None}


def test_without_fd_nothing_is_written() -> None:
    reporter = ProgressReporter(None)
    assert not reporter.enabled
    reporter.started(world_size=1, rank=0)
    assert not _step(reporter, 1, 1.0, force=True)
    reporter.close()


def test_a_closed_reader_disables_reporting(pipe: tuple[int, int], capsys: pytest.CaptureFixture[str]) -> None:
    r, w = pipe
    os.close(r)
    reporter = ProgressReporter(w, clock=FakeClock(mono=100.0))
    reporter.started(world_size=1, rank=0)  # EPIPE: switched off, no exception
    assert not reporter.enabled
    assert "reporting disabled" in capsys.readouterr().err
    assert not _step(reporter, 1, 1.0, force=True)


def test_preempted_line(pipe: tuple[int, int]) -> None:
    r, w = pipe
    reporter = ProgressReporter(w)
    reporter.preempted(step=120, checkpoint_dir="/srv/out/checkpoint")
    reporter.close()

    assert _lines(r) == [{"kind": "preempted", "step": 120, "checkpoint_dir": "/srv/out/checkpoint"}]


def test_pace_fields_and_checkpointed_line(pipe: tuple[int, int]) -> None:
    r, w = pipe
    reporter = ProgressReporter(w, clock=FakeClock(mono=100.0))
    reporter.progress(
        step=40, loss=2.0, samples=320, allreduce_ms=80.0, allreduce_bytes=1024, syncs=4, sync_interval=20, slow_syncs=2
    )
    reporter.checkpointed(40, "/srv/out/checkpoint", snapshot_ms=1.23456, write_ms=9.87654)
    reporter.close()

    progress, checkpointed = _lines(r)
    assert (progress["sync_interval"], progress["slow_syncs"], progress["allreduce_ms"]) == (20, 2, 80.0)
    assert checkpointed == {
        "kind": "checkpointed",
        "step": 40,
        "checkpoint_dir": "/srv/out/checkpoint",
        "snapshot_ms": 1.235,
        "write_ms": 9.877,
    }


def test_lines_from_two_threads_stay_whole(pipe: tuple[int, int]) -> None:
    r, w = pipe
    reporter = ProgressReporter(w, min_interval_s=0.0)

    def checkpoints() -> None:
        for step in range(100):
            reporter.checkpointed(step, "/srv/out/checkpoint", snapshot_ms=1.0, write_ms=2.0)

    writer = threading.Thread(target=checkpoints)
    writer.start()
    for step in range(100):
        _step(reporter, step, 1.0)
    writer.join()
    reporter.close()

    kinds = [line["kind"] for line in _lines(r)]
    assert (kinds.count("progress"), kinds.count("checkpointed")) == (100, 100)


@pytest.mark.parametrize(
    ("synced_every", "logged"),
    [
        pytest.param(10, [1, 5, 9, 10, 14, 18, 20, 24, 28, 30], id="local-sgd-every-sync-and-each-second"),
        pytest.param(None, [1, 5, 9, 13, 17, 21, 25, 29, 30], id="gradients-every-step-at-most-each-second"),
    ],
)
def test_the_log_has_a_line_at_every_sync_and_at_most_one_a_second_between(
    synced_every: int | None, logged: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    log = StepLog("shardyard.training[rank 0/2]", 30, clock=FakeClock(step_s=0.25), wall=lambda: 1.5e9)  # 4 a s

    written = [
        step
        for step in range(1, 31)
        if log.step(step, 2.0 + 1 / step, step // 10, synced=synced_every is not None and step % synced_every == 0)
    ]

    assert written == logged
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == len(logged)
    assert lines[-1] == "shardyard.training[rank 0/2]: step 30/30 loss 2.033 syncs 3 at 2017-07-14T02:40:00.000000Z"


def test_a_late_line_tells_when_its_step_ended_and_its_window_ends_there(pipe: tuple[int, int]) -> None:
    """A rank whose sync failed tells its last step once it knows (``Steps.report_last``): the line says how long
    ago the step ended, and its pace is that of the steps, not of the wait after them."""
    r, w = pipe
    wall = FakeClock(mono=100.0)
    reporter = ProgressReporter(w, min_interval_s=1.0, clock=wall, wall=lambda: wall.mono + 1e9)
    for step in (1, 2, 3):
        wall.mono = 100.0 + 0.2 * step
        reporter.progress(step=step, loss=1.0, samples=2 * step, allreduce_ms=0.0, allreduce_bytes=0, syncs=0)
    wall.mono = 130.6  # step 3 ended at 100.6; the sync after it failed 30 s later
    assert reporter.progress(
        step=3, loss=1.0, samples=6, allreduce_ms=0.0, allreduce_bytes=0, syncs=0, force=True, ago_s=30.0
    )
    reporter.close()
    first, late = [line for line in _lines(r) if line["kind"] == "progress"]
    assert "ago_s" not in first
    assert (late["step"], late["ago_s"], round(late["step_ms"])) == (3, 30.0, 200)
    assert (first["at"], late["at"]) == (pytest.approx(1e9 + 100.2), pytest.approx(1e9 + 100.6))
