"""The monitor's HTTP status API: JSON views of jobs, nodes and services, and ``/metrics``."""

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from shardyard.monitor.views import ClusterView


def build_http(view: ClusterView, registry: CollectorRegistry) -> web.Application:
    async def jobs(_request: web.Request) -> web.Response:
        return web.json_response({"jobs": view.jobs_json(), "counts": view.counts()})

    async def job(request: web.Request) -> web.Response:
        found = view.jobs.get(request.match_info["job_id"])
        if found is None or found.state is None:
            return web.json_response({"error": "no such job"}, status=404)
        return web.json_response(found.detail())

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

    app = web.Application()
    app.router.add_get("/api/jobs", jobs)
    app.router.add_get("/api/jobs/{job_id}", job)
    app.router.add_get("/api/nodes", nodes)
    app.router.add_get("/api/services", services)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", health)
    return app
