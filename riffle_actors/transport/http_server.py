"""HTTP endpoints of ``riffle-server`` (aiohttp): ``/health``, ``/metrics``, ``/apps``, ``/debug/actors``.

- ``/health``: ``{"status": "HEALTHY"|"UNHEALTHY", "reasons": [...], "disks": [...]}``; HTTP 200
  when healthy, 503 otherwise, so a load balancer or kubelet probe can use it as is.
- ``/metrics``: Prometheus text from the server's own registry, refreshed from the actors first.
- ``/apps``: JSON list of apps with their shuffles, partitions, memory and disk bytes.
- ``/debug/actors``: mailbox statistics of every actor.

It decodes nothing and decides nothing: each handler calls one method of ``AdminService``
(``riffle_actors.admin``) and encodes its typed answer as JSON or Prometheus text.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from riffle_actors.admin import AdminService
from riffle_actors.transport.listen import start_tcp_site


def _json(data, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS), status=status,
                        content_type="application/json")


def build_app(admin: AdminService) -> web.Application:
    async def health(_request: web.Request) -> web.Response:
        report = await admin.health()
        return _json(report.to_json(), 200 if report.healthy else 503)

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=await admin.render_metrics(), content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def apps(_request: web.Request) -> web.Response:
        return _json(await admin.apps())

    async def actors(_request: web.Request) -> web.Response:
        return _json([vars(st) if hasattr(st, "__dict__") else {
            f: getattr(st, f) for f in st.__dataclass_fields__} for st in admin.actor_statistics()])

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/apps", apps)
    app.router.add_get("/debug/actors", actors)
    return app


async def start_http_server(admin: AdminService, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(build_app(admin), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        bound = await start_tcp_site(runner, what="HTTP", keys="http_port / http_bind_address", host=host, port=port)
    except BaseException:
        await runner.cleanup()
        raise
    return runner, bound
