"""The real progress bar in a real terminal (a tmux pane): fed the views of a job that waits with a long reason, then
runs, then succeeds, the screen holds one progress line, never wider than the pane, and nothing of an earlier frame;
also when the pane narrows under it. tests/e2e/test_progress_tmux.py draws it from ``submit --wait`` on a cluster."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import wait
from tests.support.job_views import JOB, frames
from tests.support.progress_driver import DONE
from tests.support.tmux import MISSING, TMUX, Tmux, tmux_server

pytestmark = pytest.mark.skipif(TMUX is None, reason=MISSING)

DRIVER = Path(__file__).parents[1] / "support" / "progress_driver.py"
SCREEN_S = 30.0


def progress_lines(screen: list[str]) -> list[str]:
    return [line for line in screen if line.startswith(f"{JOB} ")]


class Pane:
    """The driver drawing in a tmux pane; ``show`` hands it one frame and waits until the screen has it."""

    def __init__(self, tmux: Tmux, fifo: Path, width: int, *, before: str = "") -> None:
        """``before``: a shell command that prints first, above the bar."""
        self.tmux, self.width, self.history = tmux, width, True
        os.mkfifo(fifo)
        tmux.start("bar", width, f"{before}{sys.executable} {DRIVER} {fifo}")
        self.fd = wait.until(lambda: _open_writer(fifo), "the driver to open its FIFO", SCREEN_S)

    def screen(self) -> list[str]:
        return self.tmux.screen("bar", history=self.history)

    def show(self, view: dict[str, Any], drawn: Callable[[list[str]], bool]) -> list[str]:
        os.write(self.fd, (json.dumps(view) + "\n").encode())
        return wait.until(lambda: _seen(self.screen(), drawn), f"the pane to show {view['state']}", SCREEN_S)

    def end(self) -> list[str]:
        os.close(self.fd)
        return wait.until(lambda: _seen(self.screen(), lambda s: DONE in s), "the driver's end", SCREEN_S)


def _seen(screen: list[str], drawn: Callable[[list[str]], bool]) -> list[str] | None:
    return screen if drawn(screen) else None


def _open_writer(fifo: Path) -> int | None:
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader yet
        return None


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    with tmux_server(tmp_path) as server:
        yield server


def assert_one_fitting_line(screen: list[str], width: int) -> str:
    (line,) = progress_lines(screen)
    assert all(len(row) < width for row in screen), screen
    return line


@pytest.mark.parametrize("width", [80, 200])
def test_the_bar_in_a_real_terminal(width: int, tmux: Tmux, tmp_path: Path) -> None:
    views = frames()
    waiting = next(view for view in views if view["reason"])
    running = next(view for view in views if view["state"] == "RUNNING" and view["step"])
    pane = Pane(tmux, tmp_path / "frames", width)

    shown = pane.show(waiting, lambda s: any("WAITING_FOR_ARTIFACT" in line for line in s))
    line = assert_one_fitting_line(shown, width)
    assert line.endswith("…")  # the reason, cut to the pane

    shown = pane.show(running, lambda s: any(" RUNNING " in line for line in s))
    assert "WAITING_FOR_ARTIFACT" not in assert_one_fitting_line(shown, width)
    assert not any("absent" in row for row in shown), shown

    pane.show(views[-1], lambda s: any(" SUCCEEDED " in line for line in s))
    final = pane.end()
    line = assert_one_fitting_line(final, width)
    assert " step 30/30 loss 2.012 syncs 3" in line
    assert [row for row in final if row] == [line, DONE], final
    print(f"\n--- tmux pane, {width} columns ---\n" + "\n".join(final))


def test_a_pane_that_narrows_under_the_bar_keeps_one_line(tmux: Tmux, tmp_path: Path) -> None:
    views = frames()
    waiting = next(view for view in views if view["reason"])
    pane = Pane(tmux, tmp_path / "frames", 200)
    wide = pane.show(waiting, lambda s: any("WAITING_FOR_ARTIFACT" in line for line in s))
    assert len(progress_lines(wide)[0]) > 150

    # tmux reflows the 199-column line over three rows of the narrower pane. It keeps the cursor's row where it was,
    # at the top, so the first two go to the scrollback, out of reach of any redraw: the screen is what is checked.
    tmux.resize("bar", 80)
    pane.history = False
    shown = pane.show(views[-1], lambda s: any(" SUCCEEDED " in line for line in s))

    assert_one_fitting_line(shown, 80)
    assert not any("absent" in row or "WAITING" in row for row in shown), shown


def test_a_narrowing_pane_keeps_what_was_above_the_bar(tmux: Tmux, tmp_path: Path) -> None:
    views = frames()
    waiting = next(view for view in views if view["reason"])
    pane = Pane(tmux, tmp_path / "frames", 200, before="printf 'above\\n'; ")
    pane.history = False
    pane.show(waiting, lambda s: any("WAITING_FOR_ARTIFACT" in line for line in s))

    tmux.resize("bar", 80)
    shown = pane.show(views[-1], lambda s: any(" SUCCEEDED " in line for line in s))

    # The reflow pushed "above" to the scrollback with the line's first row; the redraw erased nothing of it.
    assert_one_fitting_line(shown, 80)
    assert tmux.screen("bar")[0] == "above"
