"""``shardyard token``: a team's read token for the monitor's API, from its key in a credentials file
(``shardyard/read_tokens.py``). Set it as ``SHARDYARD_MONITOR_TOKEN`` and the CLI reads as that team: every job, but
only the team's own jobs' entrypoints."""

import argparse
import os
from pathlib import Path
from typing import TypeAlias

from shardyard.cli import client, usage

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_parser(sub: Commands) -> None:
    def command(args: argparse.Namespace) -> int:
        from shardyard.read_tokens import team_read_token
        from shardyard.signing import CredentialsError, read_credentials

        path = args.credentials or os.environ.get(client.CREDENTIALS_ENV)
        if not path:
            raise CredentialsError(f"say whose token: --credentials FILE (or {client.CREDENTIALS_ENV})")
        credentials = read_credentials(Path(path))
        teams = [args.team] if args.team else list(credentials.teams)
        if len(teams) != 1 or teams[0] not in credentials.teams:
            known = ", ".join(credentials.teams) or "none"
            raise CredentialsError(f"name one team of {path} with --team (its teams: {known})")
        key_id, secret = credentials.key(teams[0])
        print(team_read_token(teams[0], key_id, secret))
        return 0

    token = sub.add_parser("token", help="a team's read token for the monitor's API", **usage.of("token"))
    token.add_argument("--credentials", help=f"the team's keys (env {client.CREDENTIALS_ENV})")
    token.add_argument("--team", help="whose token (the file's one team when it holds one)")
    token.set_defaults(func=command)
