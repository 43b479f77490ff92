"""``shardyard token``: a team's read token for the monitor, from its newest key not revoked; the monitor, given the
same credentials file, knows it as that team's."""

from pathlib import Path

import pytest

from shardyard.cli.main import main
from shardyard.read_tokens import reader_of
from shardyard.signing import read_credentials


def test_the_token_is_the_teams_newest_key_not_revoked_and_names_the_team(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        "teams:\n  team-a:\n    keys:\n"
        f"      k1: {{secret: {'aa' * 16}, revoked: true}}\n      k2: {{secret: {'bb' * 16}}}\n"
        f"  team-b:\n    keys:\n      k1: {{secret: {'cc' * 16}}}\n"
    )

    assert main(["token", "--credentials", str(keys), "--team", "team-a"]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("team:team-a:k2:")
    assert reader_of(read_credentials(keys), token) == "team-a"

    assert main(["token", "--credentials", str(keys)]) == 2  # two teams: say whose
    assert "name one team" in capsys.readouterr().err
