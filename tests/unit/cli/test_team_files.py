"""``shardyard up --queues-file --credentials-file``: each file is checked before anything starts, and handed to
the services that read it (the queues to the queue and the scheduler, the keys to the queue); without keys given, a
cluster is secured with a local key per queue unless ``--insecure``."""

import argparse
from pathlib import Path

import pytest

from shardyard.cli.team_files import openness, secured, team_files
from shardyard.errors import ClusterError
from shardyard.signing import CredentialsError, read_credentials


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


def up_args(*argv: str) -> argparse.Namespace:
    from shardyard.cli.main import parser

    return parser().parse_args(["up", *argv])


def test_a_cluster_is_secured_by_default_with_a_local_key_per_queue(tmp_path: Path) -> None:
    queues = tmp_path / "q.yaml"
    queues.write_text("queues:\n  team-a: {gpus: {A100: 1}}\n  team-b: {gpus: {A100: 1}}\n")

    credentials, sealed = secured(up_args("--queues-file", str(queues)), tmp_path / "run")

    assert sealed and credentials == (tmp_path / "run" / "credentials.yaml").resolve()
    assert credentials.stat().st_mode & 0o077 == 0
    keys = read_credentials(credentials)
    assert sorted(keys.teams) == ["default", "team-a", "team-b"] and keys.anonymous_queue is None
    secrets = {spec.secret for team in keys.teams.values() for spec in team.keys.values()}
    assert len(secrets) == 3  # each queue's key its own
    first = credentials.read_text()
    secured(up_args("--queues-file", str(queues)), tmp_path / "run")
    assert credentials.read_text() == first  # the next up from the same folder keeps them


def test_an_up_from_the_same_folder_keeps_the_keys_and_gives_a_new_queue_one(tmp_path: Path) -> None:
    credentials, _sealed = secured(up_args(), tmp_path / "run")
    before = read_credentials(credentials).teams["default"]
    queues = tmp_path / "q.yaml"
    queues.write_text("queues:\n  team-c: {gpus: {A100: 1}}\n")

    again, _sealed = secured(up_args("--queues-file", str(queues), "--anonymous-queue", "team-c"), tmp_path / "run")

    keys = read_credentials(again)
    assert keys.teams["default"] == before
    assert sorted(keys.teams) == ["default", "team-c"] and keys.anonymous_queue == "team-c"
    assert again.stat().st_mode & 0o077 == 0


def test_the_cluster_secret_of_a_run_folder_is_made_once(tmp_path: Path) -> None:
    from shardyard.cli.team_files import cluster_secret

    first = cluster_secret(tmp_path, sign_events=True)
    secret = Path(first).read_bytes()

    assert cluster_secret(tmp_path, sign_events=True) == first
    assert Path(first).read_bytes() == secret


def test_the_anonymous_queue_takes_unsigned_submissions_only_when_named(tmp_path: Path) -> None:
    credentials, _sealed = secured(up_args("--anonymous-queue", "public"), tmp_path)
    assert credentials is not None and read_credentials(credentials).anonymous_queue == "public"
    for bad in ("x\nteams:", "-lead", "a" * 65):
        with pytest.raises(ClusterError, match="not a queue name"):
            secured(up_args(f"--anonymous-queue={bad}"), tmp_path)
    with pytest.raises(ClusterError, match="insecure"):
        secured(up_args("--insecure", "--anonymous-queue", "public"), tmp_path)
    given = tmp_path / "given.yaml"
    with pytest.raises(ClusterError, match="set anonymous_queue in"):
        secured(up_args("--credentials-file", str(given), "--anonymous-queue", "public"), tmp_path)


def test_given_keys_are_used_as_they_are_and_insecure_is_an_open_cluster(tmp_path: Path) -> None:
    given = tmp_path / "given.yaml"
    assert secured(up_args("--credentials-file", str(given)), tmp_path / "a") == (given, True)
    assert secured(up_args("--insecure"), tmp_path / "b") == (None, False)
    assert secured(up_args("--insecure", "--sign-events"), tmp_path / "b") == (None, True)
    assert secured(up_args("--insecure", "--credentials-file", str(given)), tmp_path / "b") == (given, False)
    assert not (tmp_path / "b" / "credentials.yaml").exists()
    assert secured(up_args("--secure"), tmp_path / "c")[1]  # the default now; the flag is still taken


def test_up_says_how_open_the_cluster_is() -> None:
    assert openness("", "") == "events NOT sealed; any submission is taken (an open cluster: --insecure)"
    assert openness("/r/cluster.secret", "/r/credentials.yaml").startswith("events sealed; submissions signed with")
