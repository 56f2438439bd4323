"""The coordinator's HTTP JSON API (aiohttp + orjson), read by operators, ``riffle-ctl`` and tests.

Routes:

| route | answer |
|---|---|
| ``GET /api/servers`` | list of server dicts (``server_to_dict``), sorted by id |
| ``GET /api/servers/{id}`` | one server dict, 404 when unknown |
| ``POST /api/servers/{id}/status`` | admin (below); body ``{"status": "DECOMMISSIONING" \\| "ACTIVE"}``: operator override (ACTIVE clears it); returns the server dict; 400 bad body, 404 unknown id |
| ``GET /api/apps`` | live apps (``app_to_dict``) |
| ``POST /api/servers/{id}/status`` also takes ``DECOMMISSIONED`` | what ``riffle-ctl instance kill`` sends: no new partitions until ACTIVE again |
| ``POST /api/servers/{id}/tags`` | admin; body ``{"add": [...], "remove": [...]}``: operator tags, matched like the server's own; returns the server dict |
| ``GET /api/historical_apps`` | expired apps, newest first (bounded by ``[app] history_size``) |
| ``GET /api/health`` | ``{"status": "ok", "servers", "active_servers", "apps", "uptime_s", "version", "rpc_calls", ...}`` (below) |
| ``GET /metrics`` | Prometheus text (``coordinator.metrics``), refreshed from the service first |
| ``GET /`` , ``GET /ui/...`` | the status page: static HTML/JS/CSS shipped in ``riffle_actors/coordinator/static`` (no CDN) |

Uniffle-compatible routes (the Java coordinator's ``coordinator/web/resource/ServerResource`` and
``ApplicationResource``), so Uniffle's dashboard and Riffle's ctl work against this coordinator.
Every answer is upstream's envelope ``{"code": 0, "data": ..., "errMsg": null}`` (``code`` -1 and
``errMsg`` on failure, still HTTP 200, as upstream):

| route | ``data`` |
|---|---|
| ``GET /api/server/status`` | ``"success"`` |
| ``GET /api/server/nodes[?status=S]`` | list of upstream ``ServerNode`` objects (``uniffle_node``), by id; without ``status`` the excluded ones are left out, ``status=EXCLUDED`` lists only them |
| ``GET /api/server/nodes/{id}`` | one ``ServerNode`` (``null`` when unknown, as upstream) |
| ``GET /api/server/nodes/summary`` | ``{status name: count}`` |
| ``POST /api/server/decommission`` / ``cancelDecommission`` | admin; body ``{"serverIds": [...]}``; ``data``: ``{id: {"ok", "message"}}``, what each server answered (upstream: ``null``) |
| ``POST /api/server/{id}/decommission`` / ``{id}/cancelDecommission`` | admin; ``data`` as above |
| ``POST /api/server/applications`` | upstream ``Application`` objects, body ``ApplicationRequest`` (``applications``, ``pageSize`` 10, ``currentPage`` 1, ``heartBeatStartTime``/``EndTime`` (epoch ms), ``appIdRegex``), sorted by id; bounded by ``validation.AppFilter`` (RE2 regex, ``pageSize`` <= 1000, body <= 4 MiB), matched in slices |
| ``GET /api/app/total`` | ``{"appCurrent", "appTotality"}`` |
| ``GET /api/app/userTotal`` | ``[{"userName", "appNum"}]``, most apps first |
| ``GET /api/app/appInfos`` | ``AppInfoVO`` objects, newest registration first |
| ``GET /api/coordinator/info`` | ``{"coordinatorId", "serverIp", "serverPort", "serverWebPort", "version", "gitCommitId", "startTime"}`` (ports as strings, as upstream) |
| ``GET /api/coordinator/conf`` | ``[{"argumentKey", "argumentValue"}]``: the config as dotted keys, ``[admin]`` left out; the values of ``remote_storage.conf`` are redacted unless the request carries the admin credentials |
| ``GET /api/coordinator/prometheus/metrics/all`` | the Prometheus text of ``/metrics`` (not enveloped, as upstream) |

``/api/health`` also shows the admission counters: ``max_servers``, ``server_id_conflicts`` (each
conflict counted once) and ``heartbeats_refused`` (refused heartbeats by kind).

Every route that changes state is wrapped in ``admin_auth.guard`` (``transport.admin_auth``): 403
and the reason while no admin credential is configured, 401 for a missing or wrong one. The
read-only routes stay open. Times are epoch milliseconds (``*_ms``), sizes bytes.

A thin adapter like the gRPC one: each route parses its request, calls one method of
``CoordinatorService`` (``coordinator.service``: servers, apps, operator actions, Uniffle's
queries) or ``CoordinatorAdmin`` (``coordinator.admin``: health, metrics, info, config) and encodes
the typed answer. It does not cover: the decisions (the service layer) or the gRPC API
(``transport.coordinator_grpc``).
"""

from __future__ import annotations

import time
from importlib import resources
from typing import Any

import orjson
from aiohttp import web

from riffle_actors.coordinator.actors import UnknownServerError
from riffle_actors.coordinator.admin import CoordinatorAdmin, CoordinatorHealth, CoordinatorInfo
from riffle_actors.coordinator.apps import AppView
from riffle_actors.coordinator.cluster import INTEGRITY_KEYS, ServerStatus, ServerView
from riffle_actors.coordinator.service import CoordinatorService, StatusChange
from riffle_actors.coordinator.validation import AppFilter, InvalidFilter
from riffle_actors.credentials import AdminCredentials
from riffle_actors.errors import InvalidRequestError
from riffle_actors.transport.admin_auth import guard

#: Bytes an ``ApplicationRequest`` body may have (10000 listed ids of 255 characters fit).
MAX_FILTER_BODY = 4 << 20


def server_to_dict(v: ServerView) -> dict[str, Any]:
    """The JSON form of one server (the fields riffle-ctl's ``instances`` table shows)."""
    n = v.node
    return {
        "id": n.id,
        "ip": n.ip,
        "peer_host": v.peer_host,
        "grpc_port": n.grpc_port,
        "netty_port": n.netty_port,
        "http_port": n.http_port,
        "status": v.status.name,
        "reported_status": n.reported_status.name,
        "operator_status": v.operator_status.name if v.operator_status is not None else None,
        "excluded": v.excluded,
        "is_healthy": n.is_healthy,
        "tags": sorted(v.tags),
        "operator_tags": sorted(v.operator_tags),
        "heartbeat_age_s": round(v.heartbeat_age_s, 3),
        "used_memory": n.used_memory,
        "pre_allocated_memory": n.pre_allocated_memory,
        "available_memory": n.available_memory,
        "event_num_in_flush": n.event_num_in_flush,
        "assigned_partitions": v.assigned_partitions,
        "total_assigned_partitions": v.total_assigned_partitions,
        "app_count": len(n.app_ids),
        **{key: dict(n.integrity).get(key, 0) for key in INTEGRITY_KEYS},
        "registered_ms": v.registered_epoch_ms,
        "last_heartbeat_ms": v.last_heartbeat_epoch_ms,
        "start_time_ms": n.start_time_ms,
        "version": n.version,
        "git_commit_id": n.git_commit_id,
        "disks": [
            {
                "mount_point": d.mount_point,
                "media": d.media,
                "capacity": d.capacity_bytes,
                "used_bytes": d.used_bytes,
                "status": d.status,
            }
            for d in n.disks
        ],
    }


def app_to_dict(a: AppView) -> dict[str, Any]:
    """The JSON form of one application."""
    out: dict[str, Any] = {
        "app_id": a.app_id,
        "user": a.user,
        "version": a.version,
        "git_commit_id": a.git_commit_id,
        "registered_ms": a.registered_epoch_ms,
        "last_heartbeat_ms": a.last_heartbeat_epoch_ms,
        "shuffles": a.shuffles,
        "partitions": a.partitions,
        "servers": list(a.servers),
    }
    if a.expired_epoch_ms is not None:
        out["expired_ms"] = a.expired_epoch_ms
    return out


def health_to_dict(h: CoordinatorHealth) -> dict[str, Any]:
    """``/api/health``'s JSON (its keys in this order)."""
    return {"status": h.status, "servers": h.servers, "active_servers": h.active_servers, "apps": h.apps,
            "uptime_s": h.uptime_s, "version": h.version, "rpc_calls": h.rpc_calls, "max_servers": h.max_servers,
            "server_id_conflicts": h.server_id_conflicts, "heartbeats_refused": h.heartbeats_refused,
            "requests_refused": h.requests_refused}


def info_to_dict(i: CoordinatorInfo | None) -> dict[str, Any]:
    """Upstream's ``/api/coordinator/info`` fields ({} before the ports are bound)."""
    if i is None:
        return {}
    return {"coordinatorId": i.coordinator_id, "serverIp": i.server_ip, "serverPort": i.server_port,
            "serverWebPort": i.server_web_port, "version": i.version, "gitCommitId": i.git_commit_id,
            "startTime": i.start_time_ms}


def told_to_dict(change: StatusChange) -> dict[str, Any] | None:
    t = change.told
    return {"action": t.action, "ok": t.ok, "message": t.message} if t is not None else None


# ------------------------------------------------------------------ Uniffle's shapes

def uniffle_node(v: ServerView) -> dict[str, Any]:
    """Upstream's ``ServerNode`` as Jackson writes it (its getters): times in epoch ms, ``storageInfo``
    keyed by mount point with ``StorageInfo``'s three getters, ``appIdToInfos`` keyed by app id."""
    n = v.node
    return {
        "id": n.id,
        "ip": n.ip,
        "grpcPort": n.grpc_port,
        "timestamp": v.last_heartbeat_epoch_ms,
        "preAllocatedMemory": n.pre_allocated_memory,
        "availableMemory": n.available_memory,
        "eventNumInFlush": n.event_num_in_flush,
        "usedMemory": n.used_memory,
        "tags": sorted(v.tags),
        "status": v.status.name,
        "storageInfo": {d.mount_point: {"status": d.status, "type": d.media, "usedBytes": d.used_bytes}
                        for d in n.disks},
        "registrationTime": v.registered_epoch_ms,
        "totalMemory": n.available_memory + n.used_memory,
        "nettyPort": n.netty_port,
        "jettyPort": n.http_port,
        "startTime": n.start_time_ms,
        "version": n.version,
        "gitCommitId": n.git_commit_id,
        "appIdToInfos": {app: {"appId": app, "partitionNum": 0, "memorySize": 0, "localFileNum": 0,
                               "localTotalSize": 0, "hadoopFileNum": 0, "hadoopTotalSize": 0, "totalSize": 0}
                         for app in n.app_ids},
        "displayMetrics": {k: str(v) for k, v in n.integrity},
    }


def _java_time(epoch_ms: int) -> str:
    """``yyyy-MM-dd HH:mm:ss`` in local time (upstream's ``Application`` date pattern)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch_ms / 1000))


def uniffle_application(a: AppView, remote_storage_path: str) -> dict[str, Any]:
    """Upstream's ``Application`` (``POST /api/server/applications``)."""
    return {
        "applicationId": a.app_id,
        "user": a.user,
        "lastHeartBeatTime": _java_time(a.last_heartbeat_epoch_ms),
        "remoteStoragePath": remote_storage_path or None,
        "registrationTime": _java_time(a.registered_epoch_ms),
    }


def uniffle_app_info(a: AppView) -> dict[str, Any]:
    """Upstream's ``AppInfoVO`` (``GET /api/app/appInfos``); per-server sizes are not reported to us: 0."""
    return {
        "userName": a.user, "appId": a.app_id, "updateTime": a.last_heartbeat_epoch_ms,
        "registrationTime": a.registered_epoch_ms, "version": a.version, "gitCommitId": a.git_commit_id,
        "partitionNum": a.partitions, "memorySize": 0, "localFileNum": 0, "localTotalSize": 0,
        "hadoopFileNum": 0, "hadoopTotalSize": 0, "totalSize": 0,
    }


def _ok(data: Any) -> web.Response:
    return _json({"code": 0, "data": data, "errMsg": None})


def _fail(message: str) -> web.Response:
    return _json({"code": -1, "data": None, "errMsg": message})


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status=status)


def build_app(*, service: CoordinatorService, admin: CoordinatorAdmin, auth: AdminCredentials) -> web.Application:
    """The aiohttp application; the composition root runs it (``riffle_actors.coordinator_server``)."""

    async def servers(_: web.Request) -> web.Response:
        return _json([server_to_dict(v) for v in await service.list_servers()])

    async def server(request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        view = await service.server(sid)
        if view is None:
            return _error(404, f"unknown server {sid!r}")
        return _json(server_to_dict(view))

    async def set_status(request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        try:
            body = orjson.loads(await request.read())
            status = ServerStatus[body["status"]]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return _error(400, 'body must be {"status": "DECOMMISSIONING"} or {"status": "ACTIVE"}')
        try:
            change = await service.decommission(sid, status)
        except InvalidRequestError as e:
            return _error(400, str(e))
        except UnknownServerError as e:
            return _error(404, str(e))
        out = server_to_dict(change.view)
        told = told_to_dict(change)
        if told is not None:
            out["server_told"] = told
        return _json(out)

    async def set_tags(request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        try:
            body = orjson.loads(await request.read())
            add, remove = body.get("add", []), body.get("remove", [])
            if not isinstance(add, list) or not isinstance(remove, list) or not (add or remove):
                raise TypeError
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            return _error(400, 'body must be {"add": ["tag", ...], "remove": ["tag", ...]} (at least one tag)')
        try:
            view = await service.set_server_tags(sid, add=add, remove=remove)
        except InvalidRequestError as e:
            return _error(400, str(e))
        except UnknownServerError as e:
            return _error(404, str(e))
        return _json(server_to_dict(view))

    async def apps(_: web.Request) -> web.Response:
        return _json([app_to_dict(a) for a in await service.list_apps()])

    async def historical_apps(_: web.Request) -> web.Response:
        return _json([app_to_dict(a) for a in await service.list_apps(historical=True)])

    async def health(_: web.Request) -> web.Response:
        return _json(health_to_dict(await admin.health()))

    async def prometheus(_: web.Request) -> web.Response:
        return web.Response(body=await admin.render_metrics(), content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    # -------------------------------------------------------------- Uniffle-compatible routes
    async def u_status(_: web.Request) -> web.Response:
        return _ok("success")

    async def u_nodes(request: web.Request) -> web.Response:
        return _ok([uniffle_node(v) for v in await service.nodes(request.query.get("status"))])

    async def u_node(request: web.Request) -> web.Response:
        view = await service.server(request.match_info["id"])
        return _ok(uniffle_node(view) if view is not None else None)

    async def u_summary(_: web.Request) -> web.Response:
        return _ok(await service.status_summary())

    async def _set_many(server_ids: Any, status: ServerStatus) -> web.Response:
        if not isinstance(server_ids, list) or not server_ids or not all(isinstance(i, str) for i in server_ids):
            return _fail("Parameter[serverIds] should not be empty!")
        try:
            changes = await service.decommission_many(server_ids, status)
        except (InvalidRequestError, UnknownServerError) as e:
            return _fail(str(e))
        told = {c.view.node.id: {"ok": c.told.ok, "message": c.told.message} for c in changes if c.told}
        return _ok(told or None)  # None: no server is told (no tell_server wired), as upstream

    async def _server_ids(request: web.Request) -> Any:
        try:
            body = orjson.loads(await request.read() or b"{}")
        except orjson.JSONDecodeError:
            return None
        return body.get("serverIds") if isinstance(body, dict) else None

    async def u_decommission(request: web.Request) -> web.Response:
        return await _set_many(await _server_ids(request), ServerStatus.DECOMMISSIONING)

    async def u_cancel(request: web.Request) -> web.Response:
        return await _set_many(await _server_ids(request), ServerStatus.ACTIVE)

    async def u_decommission_one(request: web.Request) -> web.Response:
        return await _set_many([request.match_info["id"]], ServerStatus.DECOMMISSIONING)

    async def u_cancel_one(request: web.Request) -> web.Response:
        return await _set_many([request.match_info["id"]], ServerStatus.ACTIVE)

    async def u_applications(request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > MAX_FILTER_BODY:
            return _fail(f"ApplicationRequest: more than {MAX_FILTER_BODY} bytes")
        try:
            body = orjson.loads(await _read_bounded(request, MAX_FILTER_BODY) or b"null")
            wanted = AppFilter.parse(body)
        except orjson.JSONDecodeError:
            return _fail("ApplicationRequest Is not null")
        except InvalidFilter as e:
            return _fail(str(e))
        page = await service.find_apps(wanted)
        return _ok([uniffle_application(a, service.remote_storage_path) for a in page])

    async def u_app_total(_: web.Request) -> web.Response:
        stats = await service.app_stats()
        return _ok({"appCurrent": stats.active, "appTotality": stats.registered_total})

    async def u_user_total(_: web.Request) -> web.Response:
        return _ok([{"userName": u, "appNum": n} for u, n in await service.user_totals()])

    async def u_app_infos(_: web.Request) -> web.Response:
        return _ok([uniffle_app_info(a) for a in await service.apps_by_registration()])

    async def u_coordinator_info(_: web.Request) -> web.Response:
        return _ok(info_to_dict(admin.info()))

    async def u_coordinator_conf(request: web.Request) -> web.Response:
        privileged = auth.configured and auth.check(request.headers.get("Authorization"))
        return _ok([{"argumentKey": k, "argumentValue": v} for k, v in admin.config_items(privileged=privileged)])

    # -------------------------------------------------------------- the status page
    async def index(_: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/ui/")

    async def static(request: web.Request) -> web.StreamResponse:
        name = request.match_info.get("name") or "index.html"
        asset = _STATIC.get(name)
        if asset is None:
            return _error(404, f"no such page {name!r}")
        body, content_type = asset
        return web.Response(body=body, content_type=content_type, charset="utf-8",
                            headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
                                     "Content-Security-Policy": "default-src 'self'; img-src 'self' data:"})

    app = web.Application()
    app.router.add_get("/api/servers", servers)
    app.router.add_get("/api/servers/{id}", server)
    app.router.add_post("/api/servers/{id}/status", guard(auth, set_status))
    app.router.add_post("/api/servers/{id}/tags", guard(auth, set_tags))
    app.router.add_get("/api/apps", apps)
    app.router.add_get("/api/historical_apps", historical_apps)
    app.router.add_get("/api/health", health)
    app.router.add_get("/metrics", prometheus)
    app.router.add_get("/api/server/status", u_status)
    app.router.add_get("/api/server/nodes", u_nodes)
    app.router.add_get("/api/server/nodes/summary", u_summary)
    app.router.add_get("/api/server/nodes/{id}", u_node)
    app.router.add_post("/api/server/decommission", guard(auth, u_decommission))
    app.router.add_post("/api/server/cancelDecommission", guard(auth, u_cancel))
    app.router.add_post("/api/server/{id}/decommission", guard(auth, u_decommission_one))
    app.router.add_post("/api/server/{id}/cancelDecommission", guard(auth, u_cancel_one))
    app.router.add_post("/api/server/applications", u_applications)
    app.router.add_get("/api/app/total", u_app_total)
    app.router.add_get("/api/app/userTotal", u_user_total)
    app.router.add_get("/api/app/appInfos", u_app_infos)
    app.router.add_get("/api/coordinator/info", u_coordinator_info)
    app.router.add_get("/api/coordinator/conf", u_coordinator_conf)
    app.router.add_get("/api/coordinator/prometheus/metrics/all", prometheus)
    app.router.add_get("/", index)
    app.router.add_get("/ui/", static)
    app.router.add_get("/ui/{name}", static)
    return app


async def _read_bounded(request: web.Request, limit: int) -> bytes:
    """The body, or ``InvalidFilter`` once it passes ``limit`` bytes (a chunked body has no length)."""
    data = bytearray()
    async for chunk in request.content.iter_chunked(64 << 10):
        data += chunk
        if len(data) > limit:
            raise InvalidFilter(f"ApplicationRequest: more than {limit} bytes")
    return bytes(data)


def _load_static() -> dict[str, tuple[bytes, str]]:
    """The status page's files, read once from the package (``riffle_actors/coordinator/static``)."""
    types = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
    out: dict[str, tuple[bytes, str]] = {}
    root = resources.files("riffle_actors.coordinator") / "static"
    for entry in root.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in types:
            out[entry.name] = (entry.read_bytes(), types[suffix])
    return out


_STATIC = _load_static()
