"""The progress bar of ``submit --wait``: never wider than the terminal, one line whatever it showed before, and off a
terminal a line per change. The screen here is a small terminal of our own (wrapping at its width, and the few
controls the bar writes); tests/e2e/test_progress_tmux.py draws the bar in a real one."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest

from shardyard.cli.progress import BAR, MIN_BAR, ProgressLine, fit, render
from tests.support.job_views import FINAL_LOSS, JOB, LONG_REASON, frames

CONTROL = re.compile(r"\r|\n|\x1b\[(\d*)([AJK])|\x1b\[2K")


class Screen(io.StringIO):
    """A terminal ``width`` columns wide that wraps what is written past its last column (as a terminal does), with
    carriage return, newline, cursor up (``ESC[nA``), erase below (``ESC[J``) and erase line (``ESC[2K``)."""

    encoding = "utf-8"

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width
        self.rows: list[str] = [""]
        self.row = self.col = 0

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        at = 0
        for match in CONTROL.finditer(text):
            self._put(text[at : match.start()])
            self._control(match)
            at = match.end()
        self._put(text[at:])
        return len(text)

    def _control(self, match: re.Match[str]) -> None:
        token = match.group(0)
        if token == "\r":
            self.col = 0
        elif token == "\n":
            self._down()
            self.col = 0
        elif token == "\x1b[2K":
            self.rows[self.row] = ""
        elif match.group(2) == "A":
            self.row = max(0, self.row - int(match.group(1) or 1))
        elif match.group(2) == "J":
            self.rows[self.row] = self.rows[self.row][: self.col]
            del self.rows[self.row + 1 :]

    def _put(self, text: str) -> None:
        for char in text:
            if self.col == self.width:  # a character past the last column wraps onto the next row
                self._down()
                self.col = 0
            line = self.rows[self.row].ljust(self.col)
            self.rows[self.row] = line[: self.col] + char + line[self.col + 1 :]
            self.col += 1

    def _down(self) -> None:
        self.row += 1
        if self.row == len(self.rows):
            self.rows.append("")

    def lines(self) -> list[str]:
        return [row for row in self.rows if row.strip()]


def draw(width: int, views: list[dict[str, Any]]) -> Screen:
    screen = Screen(width)
    line = ProgressLine(screen, columns=lambda _stream: screen.width)
    for view in views:
        line.update(view)
    line.close()
    return screen


@pytest.mark.parametrize("width", [20, 40, 80, 120, 200])
def test_every_frame_fits_and_leaves_one_line(width: int) -> None:
    screen = Screen(width)
    line = ProgressLine(screen, columns=lambda _stream: width)
    for view in frames():
        line.update(view)
        assert len(screen.lines()) == 1, screen.rows
        assert all(len(row) < width for row in screen.rows)
    line.close()

    (last,) = screen.lines()
    assert last.startswith(f"{JOB} SUCCEEDED") or width < 30
    assert "WAITING_FOR_ARTIFACT" not in last and "absent" not in last


def test_the_waiting_reason_is_cut_with_an_ellipsis_and_goes_once_the_job_runs() -> None:
    views = frames()
    waiting = next(view for view in views if view["reason"])

    shown = draw(80, [waiting]).lines()[0]
    assert len(shown) == 79 and shown.endswith("…") and "| WAITING_FOR_ARTIFACT: /da" in shown
    assert draw(80, [waiting, views[-1]]).lines() == [render(views[-1], 80)]
    assert render(waiting, None).endswith(LONG_REASON)  # off a terminal, whole


@pytest.mark.parametrize(
    ("width", "bar"),
    [
        pytest.param(200, "full", id="wide-full-bar"),
        pytest.param(70, "shrunk", id="narrow-shrunk-bar"),
        pytest.param(56, "none", id="too-narrow-no-bar"),
    ],
)
def test_the_bar_shrinks_on_a_narrow_terminal(width: int, bar: str) -> None:
    text = render(frames()[-1], width)

    found = re.search(r"\[([#.]+)\]", text)
    drawn = len(found.group(1)) if found else 0
    assert {"full": drawn == BAR, "shrunk": MIN_BAR <= drawn < BAR, "none": drawn == 0}[bar], text
    assert text.endswith(f"step 30/30 loss {FINAL_LOSS:.4g} syncs 3") and len(text) < width


def test_a_resize_is_followed_at_the_next_redraw() -> None:
    views = frames()
    screen = Screen(200)
    line = ProgressLine(screen, columns=lambda _stream: screen.width)
    line.update(next(view for view in views if view["reason"]))
    assert len(screen.lines()[0]) > 100
    # A reflowing terminal narrowed to 60 columns: the line drawn at 200 now spans rows, the cursor on the last.
    drawn = screen.rows[0]
    screen.width, screen.rows = 60, [drawn[i : i + 60] for i in range(0, len(drawn), 60)]
    screen.row, screen.col = len(screen.rows) - 1, len(screen.rows[-1])

    line.update(views[-1])

    assert screen.lines() == [render(views[-1], 60)]


def test_off_a_terminal_a_line_per_change() -> None:
    out = io.StringIO()
    line = ProgressLine(out)
    views = frames()
    for view in views:
        line.update(view)
        line.update(view)  # the same view again: nothing new
    line.close()

    printed = out.getvalue().splitlines()
    states = [text.split()[1] for text in printed]
    assert states == [
        "ACCEPTED",
        "READY",
        "READY",
        "SCHEDULED",
        "RUNNING",
        "RUNNING",
        "RUNNING",
        "RUNNING",
        "SUCCEEDED",
    ]
    assert printed[2].endswith(LONG_REASON) and "\x1b" not in out.getvalue()


@pytest.mark.parametrize(
    ("text", "room", "cut"),
    [
        pytest.param("abcdef", 6, "abcdef", id="fits"),
        pytest.param("abcdef", 4, "abc…", id="cut"),
        pytest.param("abcdef", 1, "…", id="one-column"),
    ],
)
def test_fit(text: str, room: int, cut: str) -> None:
    assert fit(text, room, "…") == cut


def test_an_ascii_stream_gets_an_ascii_ellipsis() -> None:
    class Ascii(Screen):
        encoding = "ascii"

    screen = Ascii(80)
    ProgressLine(screen, columns=lambda _stream: 80).update(next(view for view in frames() if view["reason"]))

    assert screen.lines()[0].endswith("...")
