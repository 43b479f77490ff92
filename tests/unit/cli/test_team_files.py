"""``shardyard up --queues-file --credentials-file``: each file is checked before anything starts, and handed to
the services that read it (the queues to the queue and the scheduler, the keys to the queue)."""

from pathlib import Path

import pytest

from shardyard.cli.team_files import team_files
from shardyard.errors import ClusterError
from shardyard.signing import CredentialsError


def test_each_file_goes_to_the_services_that_read_it(tmp_path: Path) -> None:
    queues, keys = tmp_path / "q.yaml", tmp_path / "k.yaml"
    queues.write_text("queues:\n  team-a: {gpus: {A100: 1}}\n")
    keys.write_text(f"teams:\n  team-a:\n    keys:\n      k1: {{secret: {'ab' * 16}}}\n")

    extra = team_files(queues, keys)

    assert extra == {
        "queue": ["--queues-file", str(queues.resolve()), "--credentials-file", str(keys.resolve())],
        "scheduler": ["--queues-file", str(queues.resolve())],
        "monitor": ["--credentials-file", str(keys.resolve())],
    }
    assert team_files(None, None) == {}


def test_a_bad_file_starts_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("queues:\n  team-a: {gpus: {A100: lots}}\n")
    with pytest.raises(ClusterError, match="line 2"):
        team_files(bad, None)
    bad.write_text("teams:\n  team-a:\n    keys:\n      k1: {secret: short}\n")
    with pytest.raises(CredentialsError, match="secret"):
        team_files(None, bad)
