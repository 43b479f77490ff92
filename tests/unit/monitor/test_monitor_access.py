"""Who may read the monitor's API: anyone on this host by default (it binds to 127.0.0.1); on any other address only
with the read token, which every data answer then requires; and no route writes."""

import pytest
from aiohttp.test_utils import TestClient, TestServer

from shardyard.errors import ConfigError
from shardyard.monitor.access import check_exposure, loopback
from shardyard.monitor.app import MonitorSettings
from shardyard.monitor.http import build_http
from shardyard.monitor.metrics import MonitorMetrics
from shardyard.monitor.views import ClusterView

TOKEN = "s3cret-read-token-0123"


@pytest.mark.parametrize(
    ("host", "reached_from_here_only"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True), ("0.0.0.0", False),
     ("10.1.2.3", False), ("::", False), ("monitor.internal", False)],
)  # fmt: skip
def test_only_loopback_addresses_go_without_a_token(host: str, reached_from_here_only: bool) -> None:
    assert loopback(host) is reached_from_here_only
    if reached_from_here_only:
        check_exposure(host, None)
    else:
        with pytest.raises(ConfigError, match="read token"):
            check_exposure(host, None)
        check_exposure(host, TOKEN)


def test_the_default_binds_to_this_host_only() -> None:
    assert MonitorSettings().http_host == "127.0.0.1" and MonitorSettings().http_read_token is None


async def test_with_a_token_every_data_answer_needs_it_and_the_page_and_probe_do_not() -> None:
    view = ClusterView()
    app = build_http(view, MonitorMetrics(view), read_token=TOKEN)
    async with TestClient(TestServer(app)) as client:
        for path in ("/api/jobs", "/api/summary", "/api/nodes", "/api/queues", "/metrics", "/api/jobs/x"):
            assert (await client.get(path)).status == 401, path
            assert (await client.get(path, headers={"Authorization": "Bearer wrong-token-000000"})).status == 401
            assert (await client.get(f"{path}?token={TOKEN}")).status == 401, path  # a header, not the URL
        allowed = {"Authorization": f"Bearer {TOKEN}"}
        assert (await client.get("/api/jobs", headers=allowed)).status == 200
        assert (await client.get("/metrics", headers=allowed)).status == 200
        for open_path in ("/", "/static/dashboard.js", "/healthz"):
            assert (await client.get(open_path)).status == 200, open_path


def test_no_route_writes() -> None:
    view = ClusterView()
    app = build_http(view, MonitorMetrics(view))
    methods = {route.method for route in app.router.routes()}
    assert methods <= {"GET", "HEAD"}, methods
