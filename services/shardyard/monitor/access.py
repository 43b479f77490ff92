"""Who may read the monitor's HTTP API and dashboard.

The API binds to 127.0.0.1 by default: only this host's users reach it. On any other address a read token is
required (``--http-read-token``, or ``SHARDYARD_HTTP_READ_TOKEN``): a monitor told to listen elsewhere without one
refuses to start. With a token, every answer that carries data (``/api/...``, ``/metrics``) needs it, as
``Authorization: Bearer TOKEN``; the dashboard's page and scripts (code, no data) and ``/healthz`` do not. Open the
dashboard as ``http://HOST:PORT/?token=TOKEN``: the page sends it on with each request it makes. The API has no
write endpoint: the cluster is changed through the bus only.

Given the teams' credentials file (``--credentials-file``), the monitor also takes each team's own token
(``shardyard/read_tokens.py``), as a reader of that team: it reads what the operator's token reads, but the
entrypoint of another team's job (its command, working directory and environment) is hidden from it. Without a read
token (on loopback) a request without one reads as the operator.
"""

import hmac
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from shardyard.errors import ConfigError
from shardyard.read_tokens import reader_of
from shardyard.signing import Credentials, CredentialsError, read_credentials

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/", "/healthz"})
"""What needs no token: the dashboard's page (its scripts are under ``/static/``) and the health probe."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def loopback(host: str) -> bool:
    """Whether ``host`` is reached only from this machine (``localhost``, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere


def check_exposure(host: str, token: str | None) -> None:
    """Refuse an API on an address other hosts reach without a read token."""
    if not loopback(host) and not token:
        raise ConfigError(
            f"the monitor's API would listen on {host} without a read token: set --http-read-token (or "
            "SHARDYARD_HTTP_READ_TOKEN), or keep --http-host 127.0.0.1"
        )


READER: web.RequestKey[str | None] = web.RequestKey("reader", str)
"""The request's reader: None for the operator (the read token, or no token on loopback), else a team's name."""


def reader(request: web.Request) -> str | None:
    return request.get(READER)


def token_guard(token: str | None, teams: Callable[[], Credentials | None] = lambda: None) -> Middleware:
    """aiohttp middleware: who reads. ``token`` (compared in constant time) is the operator's; a team's token (when
    ``teams`` gives the credentials) is that team's; any other is refused (401), and so is none where ``token`` is
    set."""
    expected = token.encode() if token else None

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or request.path.startswith("/static/"):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        given = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else None
        credentials = teams()
        if given is None and expected is None:
            request[READER] = None  # loopback, no token: this host's users read as the operator
        elif given is not None and expected is not None and hmac.compare_digest(given.encode(), expected):
            request[READER] = None
        elif given is not None and credentials is not None and (team := reader_of(credentials, given)) is not None:
            request[READER] = team
        else:
            return web.json_response({"error": "a read token is required (Authorization: Bearer TOKEN)"}, status=401)
        return await handler(request)

    return guard


def spec_for(spec: dict[str, Any] | None, team: str | None) -> dict[str, Any] | None:
    """``spec`` as ``team`` may read it (None: the operator): another team's entrypoint (command, working directory,
    environment names) is hidden."""
    if team is None or spec is None or spec.get("entrypoint") is None or spec.get("queue") == team:
        return spec
    return {**spec, "entrypoint": {"hidden": "another team's job: its entrypoint is its team's and the operators'"}}


class TeamsFile:
    """The teams' credentials as the file holds them now: read again when the file changed, at most every
    ``every_s`` (asked per request); a file that does not read or validate is logged and the keys in force stay."""

    def __init__(self, path: Path, *, every_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.every_s, self.clock = path, every_s, clock
        self.credentials: Credentials | None = None
        self._seen: tuple[int, int] | None = None
        self._looked_at: float | None = None
        self()

    def __call__(self) -> Credentials | None:
        now = self.clock()
        if self._looked_at is not None and now - self._looked_at < self.every_s:
            return self.credentials
        self._looked_at = now
        try:
            stat = self.path.stat()
            version = (stat.st_mtime_ns, stat.st_size)
            if version != self._seen:
                self.credentials, self._seen = read_credentials(self.path), version
        except (OSError, CredentialsError) as error:
            log.warning("credentials file %s not read (the keys in force stay): %s", self.path, error)
        return self.credentials
