"""Job-supplied text cannot drive the terminal: ``shardyard status`` and ``jobs`` print the control characters a
job's fields carry (ESC sequences that retitle or clear the screen, CR that rewrites a line, bidi overrides) as
escapes, read from a real HTTP monitor."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from shardyard.cli import main
from shardyard.cli.cluster import ClusterInfo
from shardyard.cli.inert import inert, inert_json
from tests.unit.cli.test_cli_listing import job

EVIL = "\x1b]0;pwned\x07\x1b[2J\rOK <script>alert(1)</script>\u202e"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\x0dOK <script>alert(1)</script>\\u202e"
JOB = job(job_id="evil", owner=EVIL, queue="default", message=EVIL, reason="NO_FIT", timeline=[])


@pytest.mark.parametrize(
    ("text", "shown"),
    [(EVIL, SHOWN), ("line one\nline\ttwo", "line one\nline\ttwo"), ("\x7f\x9b", "\\x7f\\x9b"), ("plain", "plain")],
)
def test_control_characters_are_shown_as_escapes(text: str, shown: str) -> None:
    assert inert(text) == shown


def test_every_string_of_an_answer_is_made_inert_keys_too() -> None:
    assert inert_json({"a\x1b": [EVIL, 1, None, {"b": "\r"}]}) == {"a\\x1b": [SHOWN, 1, None, {"b": "\\x0d"}]}


class Monitor(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        answers = {"/api/jobs/evil": JOB, "/api/jobs": {"jobs": [JOB], "counts": {"READY": 1}}}
        body = json.dumps(answers.get(self.path, {})).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Path]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Monitor)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    ClusterInfo(str(tmp_path), "127.0.0.1:1", url, str(tmp_path), False, 0.0, monitor_urls=[url]).save()
    yield tmp_path
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("argv", [("status", "evil"), ("jobs", "-o", "wide"), ("status", "evil", "-o", "json")])
def test_status_and_jobs_print_a_jobs_fields_inert(argv: tuple[str, ...], served: Path, capsys: Any) -> None:
    assert main.main(["--run-dir", str(served), *argv]) == 0

    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out and "\x07" not in out
    assert "pwned" in out  # shown, as text
