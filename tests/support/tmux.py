"""A real terminal for tests: tmux sessions on a server of the test's own (its own socket and configuration), each
a pane of a fixed size whose screen is read back with ``capture-pane``. A pane stays on screen after its command
ended (``remain-on-exit``), so the last frame can be read."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TMUX = shutil.which("tmux")
MISSING = "tmux is not installed (./dev setup installs it; apt-get install tmux)"
HEIGHT = 24


class Tmux:
    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.socket, self.config, self.env = folder / "tmux.sock", folder / "tmux.conf", env
        self.config.write_text("set-option -g remain-on-exit on\nset-option -g history-limit 5000\n")

    def run(self, *args: str) -> str:
        assert TMUX is not None, MISSING
        done = subprocess.run(
            [TMUX, "-u", "-f", str(self.config), "-S", str(self.socket), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=30,
        )
        assert done.returncode == 0, f"tmux {' '.join(args)}: {done.stderr}"
        return done.stdout

    def start(self, name: str, width: int, command: str) -> None:
        """A detached session ``name``, ``width`` x ``HEIGHT``, running ``command`` (a shell command line)."""
        self.run("new-session", "-d", "-s", name, "-x", str(width), "-y", str(HEIGHT), command)

    def screen(self, name: str, *, history: bool = True) -> list[str]:
        """The pane's lines, from the top of its scrollback (``history``) or of its screen, a line the terminal
        wrapped joined again (``-J``): a line written wider than the pane reads as wider than the pane. Trailing
        blanks, and tmux's own line that the command ended, are left out."""
        text = self.run("capture-pane", "-p", "-J", *(("-S", "-") if history else ()), "-t", name)
        lines = [line.rstrip() for line in text.splitlines() if not line.startswith("Pane is dead")]
        while lines and not lines[-1]:
            lines.pop()
        return lines

    def resize(self, name: str, width: int) -> None:
        self.run("resize-window", "-t", name, "-x", str(width), "-y", str(HEIGHT))


@contextmanager
def tmux_server(folder: Path) -> Iterator[Tmux]:
    """A tmux server of this test's own, UTF-8 (the progress bar's ellipsis), killed at the end."""
    env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1", "TERM": "xterm-256color"}
    env.pop("TMUX", None)
    tmux = Tmux(folder, env)
    try:
        yield tmux
    finally:
        subprocess.run(
            [TMUX or "tmux", "-S", str(tmux.socket), "kill-server"], capture_output=True, env=env, timeout=30
        )
