"""The live progress bar of ``submit --wait`` and ``demo``: one job's state, step, loss and syncs, and while it waits,
why.

On a terminal it is one line redrawn in place, never wider than the terminal: the width is read again at each redraw
(a resize is followed), the reason is cut with an ellipsis and the bar shrinks, or goes, on a narrow terminal. A line
wider than the terminal would wrap, and clearing the line then clears only its last row, leaving the others behind.
The last column is left free, so the cursor never waits in the terminal's deferred wrap. When the terminal became
narrower than the line last drawn, a terminal that reflows its text has made that line several rows: the redraw clears
each of them and starts again on the first.

Off a terminal (a log, a pipe) it prints one whole line each time the state, the sync count or the reason changes,
and at least every ``QUIET_S`` while nothing does (a start-up, a long first step): a follower is never left wondering.

Either way, what happened to an attempt is printed as a line of its own above the bar, once, as the monitor's timeline
has it: a shard's failure with its cause, the recovery with the retries used and left, a preemption, the job's end.
The elapsed time is since the job's submission, across its attempts.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

from shardyard.cli.render import duration

BAR = 30
"""The bar's width where the terminal has room for it."""
MIN_BAR = 10
"""Narrower than this, the bar is left out: the figures matter more."""
CLEAR_LINE = "\x1b[2K"
UP = "\x1b[A"
"""Line by line: erasing the screen below the cursor from its first column (``ESC[J``) is, to tmux and others,
clearing the screen, and they push what it held into the scrollback, old frames and all."""
REASON_ROOM = 40
"""Columns a waiting reason keeps before the bar gets any: why a job waits matters more than its empty bar."""
RUNNING_STATES = frozenset({"RUNNING", "SUCCEEDED"})
"""States whose reason, if a view still carries one, is no longer news."""
NEWS = frozenset({"shard failed", "recovering", "preempting", "preempted", "failed", "cancelled"})
"""Timeline notes printed as lines of their own: what befell an attempt, and the job's end when it was not success."""
QUIET_S = 15.0
"""Off a terminal, the longest a follower goes without a line."""


def terminal_width(stream: TextIO) -> int:
    """The columns of the terminal ``stream`` writes to; ``shutil.get_terminal_size`` (``COLUMNS``, else 80) when
    the stream has no terminal of its own to ask."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        columns = 0
    return columns or shutil.get_terminal_size().columns


def _number(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _syncs(job: dict[str, Any]) -> int:
    return max((s.get("syncs", 0) for s in (job.get("shards") or {}).values()), default=0)


def _reason(job: dict[str, Any]) -> str:
    if not job.get("reason") or job["state"] in RUNNING_STATES:
        return ""
    return f" | {job['reason']}: {job.get('message') or ''}"


def _bar(step: int, total: int, width: int) -> str:
    filled = min(width, int(width * step / total)) if total else 0
    return "[" + "#" * filled + "." * (width - filled) + "] "


def fit(text: str, room: int, ellipsis: str) -> str:
    """``text`` in at most ``room`` columns, its end replaced by ``ellipsis`` when cut."""
    if len(text) <= room:
        return text
    return text[: max(0, room - len(ellipsis))] + ellipsis[:room]


def since_submission(job: dict[str, Any], now: datetime | None = None) -> str:
    """How long ago the job was submitted (to its end, once it ended): ``1m05s``; ``-`` when the view does not say."""
    try:
        submitted = datetime.fromisoformat(str(job["submitted_at"]))
    except (KeyError, TypeError, ValueError):
        return "-"
    ended = job.get("ended_at")
    until = datetime.fromisoformat(ended) if isinstance(ended, str) else (now or datetime.now(UTC))
    return duration(max(0.0, (until - submitted).total_seconds()))


def render(job: dict[str, Any], width: int | None, *, ellipsis: str = "…", now: datetime | None = None) -> str:
    """The progress line of a job view (``/api/jobs/ID``): in ``width`` columns at most, or whole when None."""
    total = job.get("max_steps") or 0
    step = job.get("step") or 0
    head = f"{job['job_id']} {job['state']:<10} "
    figures = f"step {step}/{total or '?'} loss {_number(job.get('loss'))} syncs {_syncs(job)}"
    elapsed = f"{since_submission(job, now)} since submission "
    reason = _reason(job)
    if width is None:
        return head + elapsed + _bar(step, total, BAR) + figures + reason
    room = max(1, width - 1)
    left = room - len(head) - len(figures) - min(len(reason), REASON_ROOM)
    if len(elapsed) <= left:  # the reason first, then the time, then the bar
        head, left = head + elapsed, left - len(elapsed)
    bar_width = min(BAR, left - 3)
    bar = _bar(step, total, bar_width) if bar_width >= MIN_BAR else ""
    return fit(head + bar + figures + reason, room, ellipsis)


class ProgressLine:
    """A live one-line progress bar on a terminal; one line per change elsewhere. ``update`` takes each new view of
    the job, ``close`` ends the line."""

    def __init__(self, stream: TextIO = sys.stdout, *, columns: Callable[[TextIO], int] = terminal_width) -> None:
        self.stream, self.columns = stream, columns
        self.tty = stream.isatty()
        self.last_text = ""
        self.drawn = 0
        """Columns of the line on screen now (0: none yet)."""
        self.told: set[tuple[str, str, str]] = set()
        """The timeline notes printed so far, as (at, event, detail)."""
        self.printed_at = 0.0
        encoding = getattr(stream, "encoding", None) or "ascii"
        self.ellipsis = "…" if _encodes("…", encoding) else "..."

    def update(self, job: dict[str, Any]) -> None:
        """Take the job's view (at every poll: the line keeps time)."""
        self._news(job)
        if self.tty:
            self._redraw(job)
            return
        key = f"{job['state']} {_syncs(job)} {job.get('reason')}"
        if key == self.last_text and time.monotonic() - self.printed_at < QUIET_S:
            return
        self.last_text, self.printed_at = key, time.monotonic()
        self.stream.write(render(job, None) + "\n")
        self.stream.flush()

    def _news(self, job: dict[str, Any]) -> None:
        """Print each timeline note of ``NEWS`` not printed yet, above the bar."""
        lines = []
        for note in job.get("timeline") or []:
            key = (str(note.get("at")), str(note.get("event")), str(note.get("detail")))
            if key[1] in NEWS and key not in self.told:
                self.told.add(key)
                lines.append(f"  {key[0][11:19]} {key[1]}: {key[2]}")
        if not lines:
            return
        if self.tty and self.drawn:
            width = self.columns(self.stream)
            rows_above = (self.drawn - 1) // width if self.drawn >= width else 0
            self.stream.write("\r" + CLEAR_LINE + (UP + CLEAR_LINE) * rows_above)
            self.last_text, self.drawn = "", 0  # the bar is drawn again below the news
        self.stream.write("".join(line + "\n" for line in lines))
        self.stream.flush()

    def _redraw(self, job: dict[str, Any]) -> None:
        width = self.columns(self.stream)
        text = render(job, width, ellipsis=self.ellipsis)
        if text == self.last_text and self.drawn < width:
            return
        # A line drawn wider than the terminal is now (it narrowed since) spans rows: each is cleared, bottom up.
        rows_above = (self.drawn - 1) // width if self.drawn >= width else 0
        self.stream.write("\r" + CLEAR_LINE + (UP + CLEAR_LINE) * rows_above + text)
        self.stream.flush()
        self.last_text, self.drawn = text, len(text)

    def close(self) -> None:
        if self.tty and self.last_text:
            self.stream.write("\n")
            self.stream.flush()


def _encodes(text: str, encoding: str) -> bool:
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True
