"""HTTP endpoints of ``riffle-server`` (aiohttp): ``/health``, ``/metrics``, ``/apps``, ``/debug/actors``.

- ``/health``: ``{"status": "HEALTHY"|"UNHEALTHY", "reasons": [...], "disks": [...]}``; HTTP 200
  when healthy, 503 otherwise, so a load balancer or kubelet probe can use it as is.
- ``/metrics``: Prometheus text from the server's own registry, refreshed from the actors first.
- ``/apps``: JSON list of apps with their shuffles, partitions, memory and disk bytes.
- ``/debug/actors``: mailbox statistics of every actor.

It only formats what ``ShuffleServer`` reports; it owns no state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from riffle_actors.transport.listen import start_tcp_site

if TYPE_CHECKING:
    from riffle_actors.server import ShuffleServer


def _json(data, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS), status=status,
                        content_type="application/json")


def build_app(server: ShuffleServer) -> web.Application:
    async def health(_request: web.Request) -> web.Response:
        report = await server.health()
        return _json(report, 200 if report["status"] == "HEALTHY" else 503)

    async def metrics(_request: web.Request) -> web.Response:
        await server.refresh_snapshot()
        return web.Response(body=server.metrics.render(), content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def apps(_request: web.Request) -> web.Response:
        return _json(await server.apps())

    async def actors(_request: web.Request) -> web.Response:
        return _json([vars(st) if hasattr(st, "__dict__") else {
            f: getattr(st, f) for f in st.__dataclass_fields__} for st in server.system.statistics()])

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/apps", apps)
    app.router.add_get("/debug/actors", actors)
    return app


async def start_http_server(server: ShuffleServer, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(build_app(server), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        bound = await start_tcp_site(runner, what="HTTP", keys="http_port / http_bind_address", host=host, port=port)
    except BaseException:
        await runner.cleanup()
        raise
    return runner, bound
