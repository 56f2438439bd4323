"""HTTP endpoints of ``riffle-server`` (aiohttp): ``/health``, ``/metrics``, ``/apps``, ``/debug/actors``, ``/admin``.

- ``/health``: ``{"status": "HEALTHY"|"UNHEALTHY", "reasons": [...], "disks": [...]}``; HTTP 200
  when healthy, 503 otherwise, so a load balancer or kubelet probe can use it as is.
- ``/metrics``: Prometheus text from the server's own registry, refreshed from the actors first.
- ``/apps``: JSON list of apps with their shuffles, partitions, memory and disk bytes.
- ``/debug/actors``: mailbox statistics of every actor.
- ``/debug/pprof/profile``, ``/debug/heap/profile`` (admin credentials) and ``/await-tree``: Riffle's
  profiling URLs (``transport.profiling_http``).
- ``GET /admin``: the lifecycle state (``ACTIVE``, ``DECOMMISSIONING``, ``STOPPING``) and the app count.
- ``POST /admin/kill``, ``/admin/decommission``, ``/admin/cancel_decommission``, and Riffle's form
  ``POST /admin?operation=KILL|DECOMMISSION|CANCEL_DECOMMISSION``: the operator actions of
  ``riffle_actors.decommission.Lifecycle``, guarded by the ``[admin]`` credentials
  (``transport.admin_auth.guard``: 403 when none are configured, 401 when wrong). 200 with
  ``{"ok", "status", "message", "apps"}`` when done (a repeated decommission, or a cancel while
  ACTIVE, is a no-op that succeeds, as upstream), 409 with the same body when the server is
  already stopping. Riffle answers these on ``GET``; here a
  state change needs ``POST``.

It decodes nothing and decides nothing: each handler calls one method of ``AdminService``
(``riffle_actors.admin``) and encodes its typed answer as JSON or Prometheus text.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from riffle_actors.admin import AdminService
from riffle_actors.credentials import AdminCredentials
from riffle_actors.decommission import Lifecycle
from riffle_actors.profiling import Profiler
from riffle_actors.transport.admin_auth import guard
from riffle_actors.transport.listen import start_tcp_site
from riffle_actors.transport.profiling_http import add_profiling_routes

#: ``/admin/{action}`` and ``?operation=`` names -> the Lifecycle method
_ACTIONS = {"kill": "kill", "decommission": "decommission", "cancel_decommission": "cancel_decommission",
            "cancel-decommission": "cancel_decommission"}


def _json(data, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS), status=status,
                        content_type="application/json")


def build_app(admin: AdminService, *, lifecycle: Lifecycle | None = None,
              credentials: AdminCredentials | None = None) -> web.Application:
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
    add_profiling_routes(app, Profiler(admin.actor_statistics),
                         credentials if credentials is not None else AdminCredentials())
    if lifecycle is not None:
        _add_admin_routes(app, lifecycle, credentials if credentials is not None else AdminCredentials())
    return app


def _add_admin_routes(app: web.Application, lifecycle: Lifecycle, credentials: AdminCredentials) -> None:
    async def run(action: str | None) -> web.Response:
        method = _ACTIONS.get((action or "").lower())
        if method is None:
            return _json({"error": f"unknown admin action {action!r}; one of: kill, decommission, "
                                   "cancel_decommission"}, 404)
        outcome = await getattr(lifecycle, method)()
        return _json(outcome.to_json(), 200 if outcome.ok else 409)

    async def state(request: web.Request) -> web.Response:
        if "operation" in request.query:
            return _json({"error": "admin operations need POST (and the admin credentials)"}, 405)
        return _json({"status": lifecycle.state.value, "apps": lifecycle.app_count})

    async def by_operation(request: web.Request) -> web.Response:
        return await run(request.query.get("operation"))

    async def by_path(request: web.Request) -> web.Response:
        return await run(request.match_info["action"])

    app.router.add_get("/admin", state)
    app.router.add_post("/admin", guard(credentials, by_operation))
    app.router.add_post("/admin/{action}", guard(credentials, by_path))


async def start_http_server(admin: AdminService, host: str, port: int, *, lifecycle: Lifecycle | None = None,
                            credentials: AdminCredentials | None = None) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(build_app(admin, lifecycle=lifecycle, credentials=credentials), access_log=None,
                           handle_signals=False)
    await runner.setup()
    try:
        bound = await start_tcp_site(runner, what="HTTP", keys="http_port / http_bind_address", host=host, port=port)
    except BaseException:
        await runner.cleanup()
        raise
    return runner, bound
