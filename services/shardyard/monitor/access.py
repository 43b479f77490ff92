"""Who may read the monitor's HTTP API and dashboard.

The API binds to 127.0.0.1 by default: only this host's users reach it. On any other address a read token is
required (``--http-read-token``, or ``SHARDYARD_HTTP_READ_TOKEN``): a monitor told to listen elsewhere without one
refuses to start. With a token, every answer that carries data (``/api/...``, ``/metrics``) needs it, as
``Authorization: Bearer TOKEN``; the dashboard's page and scripts (code, no data) and ``/healthz`` do not. Open the
dashboard as ``http://HOST:PORT/?token=TOKEN``: the page sends it on with each request it makes. The API has no
write endpoint: the cluster is changed through the bus only.
"""

import hmac
import ipaddress
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from shardyard.errors import ConfigError

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


def token_guard(token: str) -> Middleware:
    """aiohttp middleware: 401 for a request without ``token`` (compared in constant time)."""
    expected = token.encode()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or request.path.startswith("/static/"):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        given = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else None
        if given is None or not hmac.compare_digest(given.encode(), expected):
            return web.json_response({"error": "a read token is required (Authorization: Bearer TOKEN)"}, status=401)
        return await handler(request)

    return guard
