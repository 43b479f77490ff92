"""The monitor's HTTP status API: JSON views of jobs, nodes, links and services, ``/metrics``, and the dashboard page.

The cluster-wide answers (``/metrics``, nodes, links, jobs, the summary, alerts) are kept, as bytes, until the view
changes (``ClusterView.revision``): a second dashboard or scraper asking before the next event is answered without
rendering the view again. Answers are serialized by pydantic-core, in Rust.
"""

import asyncio
from collections.abc import Callable
from importlib import resources
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic_core import to_json

from shardyard.clock import Clock
from shardyard.monitor.access import reader, spec_for, token_guard
from shardyard.monitor.history import HistoryApi
from shardyard.monitor.metrics import MonitorMetrics
from shardyard.monitor.views import ClusterView
from shardyard.signing import Credentials

DASHBOARD_FILES = {
    "dashboard.html": "text/html",
    "dom.js": "text/javascript",
    "goodput.js": "text/javascript",
    "dashboard.js": "text/javascript",
    "history.js": "text/javascript",
    "queues.js": "text/javascript",
}
"""The dashboard: one page and its scripts, shipped in the package (``static/``), no build step and no CDN."""


def dashboard_files() -> dict[str, bytes]:
    """The dashboard's files, read once through importlib.resources: that finds them in a wheel as in a checkout,
    and a package built without them fails when the monitor starts, not on a user's first visit."""
    static = resources.files("shardyard.monitor").joinpath("static")
    return {name: static.joinpath(name).read_bytes() for name in DASHBOARD_FILES}


class Rendered:
    """Answers rendered from the view, each kept until the revision it was made at changes."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[int, bytes]] = {}

    def get(self, name: str, revision: int, render: Callable[[], bytes]) -> bytes:
        kept = self._kept.get(name)
        if kept is not None and kept[0] == revision:
            return kept[1]
        body = render()
        self._kept[name] = (revision, body)
        return body


def json_body(answer: Any) -> bytes:
    """JSON as browsers parse it: a diverged run's NaN or infinite loss as null (JSON has no such numbers)."""
    return to_json(answer, inf_nan_mode="null")


class StatusApi:
    """The API's handlers over one view. Each reads the view when asked; the cluster-wide answers come through
    ``Rendered``, so they are rendered once per revision however many ask."""

    def __init__(self, view: ClusterView, metrics: MonitorMetrics, clock: Clock) -> None:
        self.view, self.metrics, self.clock = view, metrics, clock
        self.files = dashboard_files()
        self.rendered = Rendered()

    def kept(self, name: str, render: Callable[[], Any]) -> Handler:
        async def serve(_request: web.Request) -> web.Response:
            return _answer(self.rendered.get(name, self.view.revision, lambda: json_body(render())))

        return serve

    async def job(self, request: web.Request) -> web.Response:
        found = self.view.jobs.get(request.match_info["job_id"])
        if found is None or found.state is None:
            return _answer(json_body({"error": "no such job"}), status=404)
        detail = self.view.job_detail(found, self.clock.now())
        return _answer(json_body({**detail, "spec": spec_for(detail.get("spec"), reader(request))}))

    async def verdict(self, request: web.Request) -> web.Response:
        """The queue's verdict on the submission written at ``?source=topic/partition/offset``; 404 until it has one."""
        found = self.view.verdicts.of(request.query.get("source", ""))
        if found is None:
            return _answer(json_body({"error": "no verdict yet"}), status=404)
        return _answer(json_body(found))

    async def series(self, request: web.Request) -> web.Response:
        found = self.view.jobs.get(request.match_info["job_id"])
        if found is None or found.state is None:
            return _answer(json_body({"error": "no such job"}), status=404)
        return _answer(json_body(found.series_json()))

    async def services(self, _request: web.Request) -> web.Response:
        view = self.view
        return _answer(
            json_body(
                {
                    "services": [s.model_dump(mode="json") for s in view.services.values()],
                    "leaders": {name: e.model_dump(mode="json") for name, e in view.leaders.items()},
                    "dead_letters": view.dead_letters,
                }
            )
        )

    async def nodes(self, _request: web.Request) -> web.Response:
        return _answer(self.rendered.get("nodes", self.view.nodes_revision, self.view.nodes_body))

    async def exposition(self, _request: web.Request) -> web.Response:
        body = self.rendered.get("metrics", self.view.revision, self.metrics.exposition)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(self, _request: web.Request) -> web.Response:
        return _answer(b'{"ok":true}')

    def static(self, name: str) -> Handler:
        async def serve(_request: web.Request) -> web.Response:
            # no-cache: the browser revalidates, so a restarted monitor's new page is picked up on reload.
            headers = {"Cache-Control": "no-cache"}
            body = self.files[name]
            return web.Response(body=body, content_type=DASHBOARD_FILES[name], charset="utf-8", headers=headers)

        return serve


def _answer(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json")


def build_http(
    view: ClusterView,
    metrics: MonitorMetrics,
    *,
    clock: Clock | None = None,
    accounting_url: str | None = None,
    read_token: str | None = None,
    teams: Callable[[], Credentials | None] | None = None,
) -> web.Application:
    """The API over ``view``; ``clock`` (the metrics' unless given) tells which link measurements are fresh;
    ``/api/history`` reads ``accounting_url`` (see monitor/history.py); with ``read_token`` every request but the
    health probe must carry it, and with ``teams`` (the credentials in force) a team's token reads as that team
    (``monitor/access.py``). Every route is a read."""
    api = StatusApi(view, metrics, clock if clock is not None else metrics.clock)
    history = HistoryApi(accounting_url, api.clock)
    guarded = read_token is not None or teams is not None
    app = web.Application(middlewares=[token_guard(read_token, teams or (lambda: None))] if guarded else [])
    app.router.add_get("/api/jobs", api.kept("jobs", lambda: {"jobs": view.jobs_json(), "counts": view.counts()}))
    app.router.add_get("/api/jobs/{job_id}", api.job)
    app.router.add_get("/api/verdict", api.verdict)
    app.router.add_get("/api/jobs/{job_id}/series", api.series)
    app.router.add_get("/api/summary", api.kept("summary", view.summary_json))
    app.router.add_get("/api/nodes", api.nodes)
    # Alerts firing now and the newest transitions, as the alerts topic says (the same on every replica).
    app.router.add_get("/api/alerts", api.kept("alerts", lambda: view.alerts.json()))
    app.router.add_get("/api/services", api.services)
    # The live nodes' measured links, worst first, slow ones marked (see monitor/network.py).
    app.router.add_get("/api/links", api.kept("links", lambda: view.links_json(api.clock.now())))
    # The teams' queues: quota and use per GPU model, pending jobs, fair share (see monitor/queues.py).
    app.router.add_get("/api/queues", api.kept("queues", view.queues_json))
    # Jobs as the accounting database keeps them: what the log has forgotten too (see monitor/history.py).
    app.router.add_get("/api/history", history.serve)
    app.on_cleanup.append(lambda _app: asyncio.to_thread(history.close))
    app.router.add_get("/metrics", api.exposition)
    app.router.add_get("/healthz", api.health)
    app.router.add_get("/", api.static("dashboard.html"))
    for name in DASHBOARD_FILES:
        app.router.add_get(f"/static/{name}", api.static(name))
    return app
