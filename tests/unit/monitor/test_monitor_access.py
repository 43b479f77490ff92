"""Who may read the monitor's API: anyone on this host by default (it binds to 127.0.0.1); on any other address only
with the read token, which every data answer then requires; and no route writes."""

from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from shardyard.errors import ConfigError
from shardyard.events import JobAccepted
from shardyard.events.job import Entrypoint
from shardyard.monitor.access import TeamsFile, check_exposure, loopback
from shardyard.monitor.app import MonitorSettings
from shardyard.monitor.http import build_http
from shardyard.monitor.metrics import MonitorMetrics
from shardyard.monitor.views import ClusterView
from shardyard.read_tokens import reader_of, team_read_token
from tests.unit.builders import at, job_spec

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


def _teams(tmp_path: Path) -> Path:
    path = tmp_path / "credentials.yaml"
    path.write_text(
        "teams:\n"
        f"  team-a:\n    keys:\n      k1: {{secret: {'aa' * 16}}}\n      old: {{secret: {'cc' * 16}, revoked: true}}\n"
        f"  team-b:\n    keys:\n      k1: {{secret: {'bb' * 16}}}\n"
    )
    return path


def _job(view: ClusterView, job_id: str, queue: str) -> None:
    entrypoint = Entrypoint(command=["python", "train.py", "--secret-flag"], env={"K": "v"})
    spec = job_spec(job_id=job_id, queue=queue, entrypoint=entrypoint)
    view.apply(JobAccepted(occurred_at=at(0), job_id=job_id, spec=spec, source_offset="s/0/0"))


async def test_a_teams_token_reads_its_own_jobs_entrypoint_and_not_another_teams(tmp_path: Path) -> None:
    view = ClusterView()
    _job(view, "job-a", "team-a")
    _job(view, "job-b", "team-b")
    teams = TeamsFile(_teams(tmp_path))
    app = build_http(view, MonitorMetrics(view), read_token=TOKEN, teams=teams)
    a_token = team_read_token("team-a", "k1", "aa" * 16)

    async def entrypoint(job_id: str, token: str) -> object:
        answer = await client.get(f"/api/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"})
        assert answer.status == 200
        return (await answer.json())["spec"]["entrypoint"]

    async with TestClient(TestServer(app)) as client:
        own = await entrypoint("job-a", a_token)
        assert isinstance(own, dict) and own["command"] == ["python", "train.py", "--secret-flag"]
        assert own["env"] == {"K": "<redacted>"}  # values are nobody's to read
        other = await entrypoint("job-b", a_token)
        assert "--secret-flag" not in str(other) and "K" not in str(other) and "hidden" in str(other)
        assert (await entrypoint("job-b", TOKEN))["command"][0] == "python"  # the operator reads every team's
        for refused in (
            team_read_token("team-a", "old", "cc" * 16),  # a revoked key's
            team_read_token("team-a", "k1", "bb" * 16),  # made with another team's secret
            a_token[:-1] + ("0" if a_token[-1] != "0" else "1"),
            "team:team-a:k1",
        ):
            answer = await client.get("/api/jobs/job-a", headers={"Authorization": f"Bearer {refused}"})
            assert answer.status == 401, refused
        assert (await client.get("/api/jobs", headers={"Authorization": f"Bearer {a_token}"})).status == 200


def test_the_teams_file_is_read_again_on_a_change_and_a_bad_one_keeps_the_keys_in_force(tmp_path: Path) -> None:
    path = _teams(tmp_path)
    now = [0.0]
    teams = TeamsFile(path, every_s=2.0, clock=lambda: now[0])
    token = team_read_token("team-b", "k1", "bb" * 16)
    credentials = teams()
    assert credentials is not None and reader_of(credentials, token) == "team-b"

    path.write_text(
        path.read_text().replace("k1: {secret: " + "bb" * 16 + "}", "k1: {secret: " + "bb" * 16 + ", revoked: true}")
    )
    assert teams() is credentials  # not looked at again within 2 s
    now[0] = 2.5
    revoked = teams()
    assert revoked is not None and reader_of(revoked, token) is None

    path.write_text("teams: [not, a, mapping]\n")
    now[0] = 5.0
    assert teams() is revoked
