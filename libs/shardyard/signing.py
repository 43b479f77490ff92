"""Signed submissions: a team's key signs what ``shardyard submit`` produces, the queue verifies it. Pure.

MUNGE-like: the credential travels in Kafka headers beside the body, ``x-shardyard-auth`` holding
``v1;TEAM;KEY_ID;ISSUED;TTL;NONCE`` (issued in Unix seconds, TTL in seconds, a random 128-bit nonce in hex) and
``x-shardyard-signature`` the HMAC-SHA256, under the key's secret, of that credential and the SHA-256 of the body. So
neither the body nor the credential can change without the key, a signature is good only for ``TTL`` seconds from its
issue (allowing ``CLOCK_SKEW_S`` either way), and each nonce is accepted once (``ReplayCache``).

The credentials file (``--credentials-file`` of the queue service and of ``shardyard submit``) lists each team's keys
by id, so a team rotates by adding a key, moving its users to it, then revoking the old one::

    anonymous_queue: default      # unsigned submissions go only into this queue (absent: none are accepted)
    teams:
      team-a:
        keys:
          k2: {secret: 3f1c...}   # at least 32 hex digits (128 bits)
          k1: {secret: 9ab0..., revoked: true}
"""

import hashlib
import hmac
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shardyard.errors import ConfigError
from shardyard.quotas import NAME_PATTERN

AUTH_HEADER = "x-shardyard-auth"
SIGNATURE_HEADER = "x-shardyard-signature"
VERSION = "v1"
DEFAULT_TTL_S = 300
MAX_TTL_S = 3600
CLOCK_SKEW_S = 30


class KeySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    secret: str = Field(pattern=r"^(?:[0-9a-fA-F]{2}){16,64}$", description="the shared secret: 16-64 bytes, hex")
    revoked: bool = False


class TeamKeys(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: dict[str, KeySpec] = Field(min_length=1)


class Credentials(BaseModel):
    """Each team's keys, and the queue unsigned submissions may go to (None: no anonymous submissions)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    anonymous_queue: str | None = Field(default=None, pattern=NAME_PATTERN)
    teams: dict[str, TeamKeys] = Field(default_factory=dict)

    def key(self, team: str) -> tuple[str, str]:
        """The team's key to sign with: its last key not revoked, as (id, secret)."""
        usable = [(key_id, spec.secret) for key_id, spec in self.teams[team].keys.items() if not spec.revoked]
        if not usable:
            raise CredentialsError(f"team {team} has no key that is not revoked")
        return usable[-1]


class CredentialsError(ConfigError):
    """A credentials file that cannot be used."""


def read_credentials(path: Path) -> Credentials:
    try:
        data = yaml.safe_load(path.read_text())
        return Credentials.model_validate(data or {})
    except (OSError, yaml.YAMLError) as error:
        raise CredentialsError(f"cannot read the credentials file {path}: {error}") from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise CredentialsError(f"credentials file {path}: {where}: {first['msg']}") from None


def new_secret() -> str:
    return secrets.token_hex(32)


def _mac(secret: str, credential: str, body: bytes) -> str:
    message = credential.encode() + b"\n" + hashlib.sha256(body).hexdigest().encode()
    return hmac.new(bytes.fromhex(secret), message, hashlib.sha256).hexdigest()


def sign(
    body: bytes,
    *,
    team: str,
    key_id: str,
    secret: str,
    now_s: float,
    ttl_s: int = DEFAULT_TTL_S,
    nonce: str | None = None,
) -> list[tuple[str, bytes]]:
    """The headers that sign ``body`` for ``team`` with key ``key_id``."""
    credential = ";".join((VERSION, team, key_id, str(int(now_s)), str(ttl_s), nonce or secrets.token_hex(16)))
    return [(AUTH_HEADER, credential.encode()), (SIGNATURE_HEADER, _mac(secret, credential, body).encode())]


class Refusal(StrEnum):
    UNAUTHENTICATED = "UNAUTHENTICATED"
    FORBIDDEN = "FORBIDDEN"
    REPLAYED = "REPLAYED"


@dataclass(frozen=True)
class Signed:
    """A good signature: the team that signed, and the nonce to remember until ``expires_s``."""

    team: str
    key_id: str
    nonce: str
    expires_s: float


@dataclass(frozen=True)
class Refused:
    reason: Refusal
    message: str


@dataclass
class ReplayCache:
    """The nonces of good signatures, each kept until its signature expires (so the cache holds at most the
    submissions of one TTL; ``limit`` bounds it beyond that: the oldest are dropped, and a replay of one of them is
    then caught only as a duplicate job)."""

    limit: int = 1_000_000
    _seen: dict[str, float] = field(default_factory=dict)

    def first_use(self, nonce: str, expires_s: float, now_s: float) -> bool:
        """Whether ``nonce`` is new (it is remembered until ``expires_s``)."""
        if nonce in self._seen:
            return False
        self._seen[nonce] = expires_s
        for oldest in list(self._seen):  # in the order they came: the expired, and beyond the limit the oldest
            if len(self._seen) <= self.limit and self._seen[oldest] >= now_s:
                break
            del self._seen[oldest]
        return True

    def remember(self, nonce: str, expires_s: float) -> None:
        """Note ``nonce`` as used, by a verdict another replica gave (read from the log): a later use is a replay."""
        self._seen.setdefault(nonce, expires_s)

    def __len__(self) -> int:
        return len(self._seen)


def verify(
    body: bytes, headers: Sequence[tuple[str, bytes]] | None, credentials: Credentials, now_s: float
) -> Signed | Refused | None:
    """The signature on ``body``: Signed, Refused with the reason, or None when there is none (unsigned)."""
    found: Mapping[str, bytes] = dict(headers or ())
    credential, signature = found.get(AUTH_HEADER), found.get(SIGNATURE_HEADER)
    if credential is None and signature is None:
        return None
    if credential is None or signature is None:
        return Refused(Refusal.UNAUTHENTICATED, f"a signed submission has both {AUTH_HEADER} and {SIGNATURE_HEADER}")
    text = credential.decode(errors="replace")  # bytes that are not UTF-8 cannot match: refused below, not raised
    parts = text.split(";")
    if len(parts) != 6 or parts[0] != VERSION or not parts[3].isdigit() or not parts[4].isdigit():
        return Refused(Refusal.UNAUTHENTICATED, f"the credential is not {VERSION};TEAM;KEY;ISSUED;TTL;NONCE")
    _v, team, key_id, issued, ttl, nonce = parts
    keys = credentials.teams.get(team)
    spec = keys.keys.get(key_id) if keys is not None else None
    if spec is None or spec.revoked:
        what = "revoked" if spec is not None else "unknown"
        return Refused(Refusal.UNAUTHENTICATED, f"key {key_id!r} of team {team!r} is {what}")
    if not hmac.compare_digest(_mac(spec.secret, text, body).encode(), signature):
        return Refused(Refusal.UNAUTHENTICATED, "the signature does not match the submission and its credential")
    issued_s, ttl_s = int(issued), min(int(ttl), MAX_TTL_S)
    if not issued_s - CLOCK_SKEW_S <= now_s <= issued_s + ttl_s + CLOCK_SKEW_S:
        return Refused(Refusal.UNAUTHENTICATED, f"the signature was issued at {issued_s} for {ttl_s} s: expired")
    return Signed(team, key_id, nonce, issued_s + ttl_s + CLOCK_SKEW_S)
