"""A team's token for the monitor's API, derived from its key in the credentials file. Pure.

``team:TEAM:KEY_ID:MAC``, the MAC an HMAC-SHA256 under the key's secret of ``shardyard-monitor-read-v1;TEAM;KEY_ID``:
``shardyard token`` prints it for a team whose key the user holds, and a monitor given the credentials file
(``--credentials-file``) knows it without being told. A revoked key's token is refused with the key. The token reads
what the operator's read token reads, except the entrypoints (command, working directory, environment names) of
other teams' jobs: a team sees its own jobs' only (``monitor/access.py``)."""

import hashlib
import hmac

from shardyard.signing import Credentials

PREFIX = "team"
CONTEXT = "shardyard-monitor-read-v1"


def team_read_token(team: str, key_id: str, secret: str) -> str:
    mac = hmac.new(bytes.fromhex(secret), f"{CONTEXT};{team};{key_id}".encode(), hashlib.sha256).hexdigest()
    return f"{PREFIX}:{team}:{key_id}:{mac}"


def reader_of(credentials: Credentials, token: str) -> str | None:
    """The team ``token`` is a read token of (a key of it, not revoked), or None."""
    prefix, _, rest = token.partition(":")
    team, _, rest = rest.partition(":")  # a team's name has no ':' (NAME_PATTERN)
    key_id, _, _mac = rest.rpartition(":")
    keys = credentials.teams.get(team)
    spec = keys.keys.get(key_id) if keys is not None else None
    if prefix != PREFIX or spec is None or spec.revoked:
        return None
    return team if hmac.compare_digest(token.encode(), team_read_token(team, key_id, spec.secret).encode()) else None
