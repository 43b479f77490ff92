"""The dashboard page in a real browser: headless Chromium renders a URL to a screenshot or to its DOM, which
``Dom`` reads back. Screenshots are test artefacts for a person to look at (``SHARDYARD_TEST_ARTEFACTS``, default
``.artefacts/``)."""

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"})


def browser() -> str:
    """Chromium's path. Missing, the test fails rather than skips: a skipped browser test would pass CI unseen."""
    for name in BROWSER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "no Chromium on PATH (tried " + ", ".join(BROWSER_NAMES) + "): the dashboard tests render the page in a real "
        "browser. Install the Debian package `chromium` (`./dev setup` does when apt-get is available).",
        pytrace=False,
    )


def artefacts() -> Path:
    folder = Path(os.environ.get("SHARDYARD_TEST_ARTEFACTS") or ROOT / ".artefacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def render(url: str, mode: str, profile: Path) -> str:
    """Load ``url`` headless and give the page 4 s of virtual time (about four polls of the API); Chromium waits for
    the page's fetches before it lets that time run, so the budget costs no wall time waiting on the monitor.
    ``mode`` is ``--dump-dom`` (the DOM is returned) or ``--screenshot=PATH``."""
    command = [
        browser(),
        "--headless",
        "--disable-gpu",
        "--no-sandbox",  # tests run as root in CI containers
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
        "--virtual-time-budget=4000",
        mode,
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def screenshot(url: str, name: str, profile: Path) -> Path:
    """A PNG of the page at ``artefacts()/name``; fails when it is missing or looks blank."""
    path = artefacts() / name
    path.unlink(missing_ok=True)
    render(url, f"--screenshot={path}", profile)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), f"{path} is not a PNG"
    assert path.stat().st_size > 30_000, f"the screenshot {path} looks blank"
    return path


class Dom(HTMLParser):
    """The dumped DOM as a flat list of (tag, attributes, ids of the open ancestors), and its visible text."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], tuple[str, ...]]] = []
        self.text: list[str] = []
        self._open: list[tuple[str, str]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {name: value or "" for name, value in attrs}
        self.elements.append((tag, found, tuple(i for _, i in self._open if i)))
        if tag not in VOID:
            self._open.append((tag, found.get("id", "")))

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        if not self._open or self._open[-1][0] not in ("style", "script"):
            self.text.append(data)

    def find(self, tag: str, *, inside: str | None = None, **attrs: str) -> list[dict[str, str]]:
        return [
            found
            for name, found, ancestors in self.elements
            if name == tag
            and (inside is None or inside in ancestors)
            and all(found.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]

    def all_text(self) -> str:
        return " ".join(" ".join(self.text).split())
