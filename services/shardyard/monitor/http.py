"""The monitor's HTTP status API: JSON views of jobs, nodes and services, ``/metrics``, and the dashboard page.

The cluster-wide answers (``/metrics``, nodes, jobs, the summary, alerts) are kept, as bytes, until the view changes
(``ClusterView.revision``): a second dashboard or scraper asking before the next event is answered without rendering
the view again. Answers are serialized by pydantic-core, in Rust.
"""

from collections.abc import Callable
from importlib import resources
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic_core import to_json

from shardyard.monitor.metrics import MonitorMetrics
from shardyard.monitor.views import ClusterView

DASHBOARD_FILES = {"dashboard.html": "text/html", "dashboard.js": "text/javascript"}
"""The dashboard: one page and its script, shipped in the package (``static/``), no build step and no CDN."""


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


def build_http(view: ClusterView, metrics: MonitorMetrics) -> web.Application:
    files = dashboard_files()
    rendered = Rendered()

    def answer(body: bytes, status: int = 200) -> web.Response:
        return web.Response(body=body, status=status, content_type="application/json")

    def kept(name: str, render: Callable[[], Any]) -> Handler:
        async def serve(_request: web.Request) -> web.Response:
            return answer(rendered.get(name, view.revision, lambda: json_body(render())))

        return serve

    async def job(request: web.Request) -> web.Response:
        found = view.jobs.get(request.match_info["job_id"])
        if found is None or found.state is None:
            return answer(json_body({"error": "no such job"}), status=404)
        return answer(json_body(found.detail()))

    async def series(request: web.Request) -> web.Response:
        found = view.jobs.get(request.match_info["job_id"])
        if found is None or found.state is None:
            return answer(json_body({"error": "no such job"}), status=404)
        return answer(json_body(found.series_json()))

    async def services(_request: web.Request) -> web.Response:
        return answer(
            json_body(
                {
                    "services": [s.model_dump(mode="json") for s in view.services.values()],
                    "leaders": {name: e.model_dump(mode="json") for name, e in view.leaders.items()},
                    "dead_letters": view.dead_letters,
                }
            )
        )

    async def nodes(_request: web.Request) -> web.Response:
        return answer(rendered.get("nodes", view.nodes_revision, view.nodes_body))

    async def exposition(_request: web.Request) -> web.Response:
        body = rendered.get("metrics", view.revision, metrics.exposition)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(_request: web.Request) -> web.Response:
        return answer(b'{"ok":true}')

    def static(name: str) -> Handler:
        async def serve(_request: web.Request) -> web.Response:
            # no-cache: the browser revalidates, so a restarted monitor's new page is picked up on reload.
            headers = {"Cache-Control": "no-cache"}
            return web.Response(body=files[name], content_type=DASHBOARD_FILES[name], charset="utf-8", headers=headers)

        return serve

    app = web.Application()
    app.router.add_get("/api/jobs", kept("jobs", lambda: {"jobs": view.jobs_json(), "counts": view.counts()}))
    app.router.add_get("/api/jobs/{job_id}", job)
    app.router.add_get("/api/jobs/{job_id}/series", series)
    app.router.add_get("/api/summary", kept("summary", view.summary_json))
    app.router.add_get("/api/nodes", nodes)
    # Alerts firing now and the newest transitions, as the alerts topic says (the same on every replica).
    app.router.add_get("/api/alerts", kept("alerts", lambda: view.alerts.json()))
    app.router.add_get("/api/services", services)
    app.router.add_get("/metrics", exposition)
    app.router.add_get("/healthz", health)
    app.router.add_get("/", static("dashboard.html"))
    for name in DASHBOARD_FILES:
        app.router.add_get(f"/static/{name}", static(name))
    return app
