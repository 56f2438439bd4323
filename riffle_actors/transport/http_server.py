"""HTTP endpoints of ``riffle-server`` (aiohttp): ``/health``, ``/metrics``, ``/apps``, ``/debug/actors``, ``/admin``.

- ``/health``: ``{"status": "HEALTHY"|"UNHEALTHY", "reasons": [...], "disks": [...]}``; HTTP 200
  when healthy, 503 otherwise, so a load balancer or kubelet probe can use it as is.
- ``/metrics``: Prometheus text from the server's own registry, refreshed from the actors first.
- ``/apps``: JSON list of apps with their shuffles, partitions, memory and disk bytes, and Riffle's
  ``AppInfo`` fields (``registry_timestamp``, ``resident_bytes``, ``partition_number`` ...).
  ``/apps?format=Json`` is the same list (Riffle's form), ``?format=Html`` an HTML table.
- ``/apps/number``: the app count (a JSON number); ``/apps/history``: purged apps (JSON list).
- ``/debug/actors``: mailbox statistics of every actor.
- ``/debug/pprof/profile``, ``/debug/heap/profile`` (admin credentials) and ``/await-tree``: Riffle's
  profiling URLs (``transport.profiling_http``).
- ``GET /admin``: the lifecycle state (``ACTIVE``, ``DECOMMISSIONING``, ``STOPPING``), the app count,
  Riffle's state name (``state``) and the tags besides the built-in ones (``tags``).
- ``POST /admin/kill``, ``/admin/decommission``, ``/admin/cancel_decommission``, and Riffle's form
  ``POST /admin?operation=KILL|DECOMMISSION|CANCEL_DECOMMISSION``: the operator actions of
  ``riffle_actors.decommission.Lifecycle``, guarded by the ``[admin]`` credentials
  (``transport.admin_auth.guard``: 403 when none are configured, 401 when wrong). 200 with
  ``{"ok", "status", "message", "apps"}`` when done (a repeated decommission, or a cancel while
  ACTIVE, is a no-op that succeeds, as upstream), 409 with the same body when the server is
  already stopping. Riffle answers these on ``GET``; here a
  state change needs ``POST``.
- Riffle's query form (``riffle-server/src/http/admin.rs``), answered as text: ``GET
  /admin?get_state`` (open: ``Lifecycle.riffle_state``), and, with ``POST`` and the admin
  credentials, ``?update_state=S`` (``Lifecycle.RIFFLE_STATES``, any case), ``?update_tags=a1,a2``,
  ``?add_tag=a1``, ``?delete_tag=a1`` (built-in tags stay: 400), ``?kill`` (409 while apps are
  registered) and ``?kill=force``. Several pairs run in order; the answer is ``OK`` (200), or
  400 / 409 with the reason as text. The same pairs on ``GET`` answer 405.

It decodes nothing and decides nothing: each handler calls one method of ``AdminService``
(``riffle_actors.admin``) and encodes its typed answer as JSON or Prometheus text.
"""

from __future__ import annotations

import html

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


#: Riffle's ``/admin`` operations that change something (POST + credentials here)
_RIFFLE_CHANGES = frozenset(("kill", "update_state", "update_tags", "add_tag", "delete_tag"))


def _text(message: str, status: int) -> web.Response:
    return web.Response(text=message, status=status)


def _apps_html(listing: list[dict]) -> str:
    """Riffle's ``/apps`` page: one row per app (every value escaped)."""
    cols = ("app_id", "registry_timestamp", "duration_minutes", "resident_bytes", "partition_number",
            "huge_partition_number", "reported_block_id_number")
    head = "".join(f"<th>{c}</th>" for c in cols)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(str(a.get(c, '')))}</td>" for c in cols) + "</tr>"
                   for a in listing)
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>riffle-server apps</title></head>"
            f"<body><table border=\"1\"><tr>{head}</tr>{rows}</table></body></html>")


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

    async def apps(request: web.Request) -> web.Response:
        fmt = request.query.get("format", "Json").lower()
        if fmt not in ("json", "html"):
            return _json({"error": f"unknown format {fmt[:20]!r}: Json or Html"}, 400)
        listing = await admin.apps()
        return _json(listing) if fmt == "json" else web.Response(text=_apps_html(listing), content_type="text/html")

    async def app_number(_request: web.Request) -> web.Response:
        return _json(admin.app_count())

    async def app_history(_request: web.Request) -> web.Response:
        return _json(await admin.history())

    async def actors(_request: web.Request) -> web.Response:
        return _json([vars(st) if hasattr(st, "__dict__") else {
            f: getattr(st, f) for f in st.__dataclass_fields__} for st in admin.actor_statistics()])

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/apps", apps)
    app.router.add_get("/apps/number", app_number)
    app.router.add_get("/apps/history", app_history)
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
        keys = {k.lower() for k in request.query}
        if "operation" in keys or keys & _RIFFLE_CHANGES:
            return _json({"error": "admin operations need POST (and the admin credentials)"}, 405)
        if "get_state" in keys:
            return web.Response(text=lifecycle.riffle_state)
        if keys:
            return _text(f"unknown admin operation {min(keys)[:40]!r}; one of: get_state, "
                         f"{', '.join(sorted(_RIFFLE_CHANGES))}", 400)
        return _json({"status": lifecycle.state.value, "apps": lifecycle.app_count, "state": lifecycle.riffle_state,
                      "tags": list(lifecycle.tags.current)})

    async def by_operation(request: web.Request) -> web.Response:
        if "operation" in request.query:
            return await run(request.query.get("operation"))
        return await riffle_form(request)

    async def riffle_form(request: web.Request) -> web.Response:
        """Riffle's ``/admin?op[=value]&...``: each pair in order."""
        pairs = list(request.query.items())
        if not pairs:
            return _text("no admin operation; one of: get_state, " + ", ".join(sorted(_RIFFLE_CHANGES)), 400)
        tags_changed = False
        try:
            for key, value in pairs:
                op = key.lower()
                if op == "get_state":
                    return web.Response(text=lifecycle.riffle_state)
                if op == "kill":
                    outcome = await lifecycle.kill(force=value.lower() == "force")
                    if not outcome.ok:
                        return _text(outcome.message, 409)
                elif op == "update_state":
                    outcome = await lifecycle.update_state(value)
                    if not outcome.ok:
                        return _text(outcome.message, 409)
                elif op == "update_tags":
                    lifecycle.tags.update([t for t in value.split(",") if t.strip()])
                    tags_changed = True
                elif op == "add_tag":
                    lifecycle.tags.add(value)
                    tags_changed = True
                elif op == "delete_tag":
                    lifecycle.tags.delete(value)
                    tags_changed = True
                else:
                    return _text(f"unknown admin operation {key[:40]!r}; one of: get_state, "
                                 f"{', '.join(sorted(_RIFFLE_CHANGES))}", 400)
        except ValueError as e:  # a bad state name, a refused tag
            return _text(str(e), 400)
        finally:
            if tags_changed:
                await lifecycle.tags_changed()
        return web.Response(text="OK")

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
