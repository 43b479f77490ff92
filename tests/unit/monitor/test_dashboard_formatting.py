"""The dashboard's formatting helpers (``monitor/static/dom.js``), run in Node: plain functions of their arguments
(the DOM builders aside), so a browser is not needed to pin what they write."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

DOM_JS = Path(__file__).resolve().parents[3] / "services" / "shardyard" / "monitor" / "static" / "dom.js"


def node() -> str:
    """Node's path. Missing, the test fails rather than skips: a skipped check would pass CI unseen."""
    found = shutil.which("node") or shutil.which("nodejs")
    if found is None:
        pytest.fail(
            "node is not on PATH. Install the Debian package `nodejs` (`./dev test` does when apt-get is available)."
        )
    return found


def evaluate(expression: str) -> object:
    """``expression``'s value with dom.js loaded, in UTC (the browser's zone stands in for the user's)."""
    script = (
        "const fs = require('fs'); const vm = require('vm');"
        f"vm.runInThisContext(fs.readFileSync({json.dumps(str(DOM_JS))}, 'utf8'));"
        f"process.stdout.write(JSON.stringify({expression}));"
    )
    done = subprocess.run(
        [node(), "-e", script], capture_output=True, text=True, timeout=30, check=False, env={**os.environ, "TZ": "UTC"}
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


NOW = "new Date('2026-12-07T13:00:00Z')"


def test_a_start_today_is_its_time_of_day() -> None:
    assert evaluate(f"hhmm('2026-12-07T14:05:30Z', {NOW})") == "14:05"


def test_a_start_on_another_day_names_the_day() -> None:
    assert evaluate(f"hhmm('2026-12-08T09:30:00Z', {NOW})") == "Tue 8 Dec 09:30"
    assert evaluate(f"hhmm('2026-12-06T23:59:00Z', {NOW})") == "Sun 6 Dec 23:59"


def test_what_is_not_a_time_is_shown_as_it_came() -> None:
    assert evaluate(f"hhmm('soon', {NOW})") == "soon"
