"""``shardyard submit --credentials`` signs what it produces with the key of the job's queue's team (its newest
key not revoked), over the bytes it produces, owner filled in; a team without a key there is an error, not an
unsigned submission."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from shardyard.cli import client, main
from shardyard.cli.cluster import ClusterInfo
from shardyard.signing import Signed, read_credentials, verify

OLD, NEW = "aa" * 32, "ab" * 32
CREDENTIALS = (
    f"teams:\n  default:\n    keys:\n      k1: {{secret: {OLD}, revoked: true}}\n      k2: {{secret: {NEW}}}\n"
)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    ClusterInfo(str(tmp_path), "127.0.0.1:1", "http://127.0.0.1:1", str(tmp_path), False, 0.0).save()
    return tmp_path


def test_submit_signs_with_the_queues_team_key(run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    produced: list[tuple[bytes, Any]] = []
    monkeypatch.setattr(
        client, "submit", lambda _b, raw, signed=(): produced.append((raw, signed)) or client.Submitted("j", 0, 1)
    )
    credentials = tmp_path / "credentials.yaml"
    credentials.write_text(CREDENTIALS)

    argv = ["--run-dir", str(run_dir), "submit", str(main.EXAMPLE), "--credentials", str(credentials), "--no-verdict"]
    assert main.main(argv) == 0  # no cluster here to give a verdict: the signing is what is checked

    ((raw, signed),) = produced
    found = verify(raw, signed, read_credentials(credentials), time.time())
    assert isinstance(found, Signed) and (found.team, found.key_id) == ("default", "k2")


def test_a_team_without_a_key_is_an_error(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(client, "submit", lambda *_a: pytest.fail("produced unsigned"))
    credentials = tmp_path / "credentials.yaml"
    credentials.write_text(CREDENTIALS.replace("default", "team-x"))
    monkeypatch.setenv(client.CREDENTIALS_ENV, str(credentials))
    job = tmp_path / "job.json"
    job.write_text(json.dumps({**json.loads(main.EXAMPLE.read_text()), "queue": "team-y"}))

    assert main.main(["--run-dir", str(run_dir), "submit", str(job)]) != 0
    assert "team-y" in capsys.readouterr().err
