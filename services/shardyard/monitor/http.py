"""The monitor's HTTP status API: JSON views of jobs, nodes and services, ``/metrics``, and the dashboard page."""

from importlib import resources

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from shardyard.monitor.views import ClusterView

DASHBOARD_FILES = {"dashboard.html": "text/html", "dashboard.js": "text/javascript"}
"""The dashboard: one page and its script, shipped in the package (``static/``), no build step and no CDN."""


def dashboard_files() -> dict[str, bytes]:
    """The dashboard's files, read once through importlib.resources: that finds them in a wheel as in a checkout,
    and a package built without them fails when the monitor starts, not on a user's first visit."""
    static = resources.files("shardyard.monitor").joinpath("static")
    return {name: static.joinpath(name).read_bytes() for name in DASHBOARD_FILES}


def build_http(view: ClusterView, registry: CollectorRegistry) -> web.Application:
    files = dashboard_files()

    async def jobs(_request: web.Request) -> web.Response:
        return web.json_response({"jobs": view.jobs_json(), "counts": view.counts()})

    async def job(request: web.Request) -> web.Response:
        found = view.jobs.get(request.match_info["job_id"])
        if found is None or found.state is None:
            return web.json_response({"error": "no such job"}, status=404)
        return web.json_response(found.detail())

    async def series(request: web.Request) -> web.Response:
        found = view.jobs.get(request.match_info["job_id"])
        if found is None or found.state is None:
            return web.json_response({"error": "no such job"}, status=404)
        return web.json_response(found.series_json())

    async def summary(_request: web.Request) -> web.Response:
        return web.json_response(view.summary_json())

    async def alerts(_request: web.Request) -> web.Response:
        """Alerts firing now and the newest transitions, as the alerts topic says (the same on every replica)."""
        return web.json_response(view.alerts.json())

    async def nodes(_request: web.Request) -> web.Response:
        return web.json_response({"nodes": view.nodes_json()})

    async def services(_request: web.Request) -> web.Response:
        return web.json_response(
            {
                "services": [s.model_dump(mode="json") for s in view.services.values()],
                "leaders": {name: e.model_dump(mode="json") for name, e in view.leaders.items()},
                "dead_letters": view.dead_letters,
            }
        )

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    def static(name: str) -> Handler:
        async def serve(_request: web.Request) -> web.Response:
            # no-cache: the browser revalidates, so a restarted monitor's new page is picked up on reload.
            headers = {"Cache-Control": "no-cache"}
            return web.Response(body=files[name], content_type=DASHBOARD_FILES[name], charset="utf-8", headers=headers)

        return serve

    app = web.Application()
    app.router.add_get("/api/jobs", jobs)
    app.router.add_get("/api/jobs/{job_id}", job)
    app.router.add_get("/api/jobs/{job_id}/series", series)
    app.router.add_get("/api/summary", summary)
    app.router.add_get("/api/nodes", nodes)
    app.router.add_get("/api/alerts", alerts)
    app.router.add_get("/api/services", services)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", health)
    app.router.add_get("/", static("dashboard.html"))
    for name in DASHBOARD_FILES:
        app.router.add_get(f"/static/{name}", static(name))
    return app
