"""The coordinator's HTTP JSON API (aiohttp + orjson), read by operators, ``riffle-ctl`` and tests.

Routes:

| route | answer |
|---|---|
| ``GET /api/servers`` | list of server dicts (``server_to_dict``), sorted by id |
| ``GET /api/servers/{id}`` | one server dict, 404 when unknown |
| ``POST /api/servers/{id}/status`` | admin (below); body ``{"status": "DECOMMISSIONING" \\| "ACTIVE"}``: operator override (ACTIVE clears it); returns the server dict; 400 bad body, 404 unknown id |
| ``GET /api/apps`` | live apps (``app_to_dict``) |
| ``GET /api/historical_apps`` | expired apps, newest first (bounded by ``[app] history_size``) |
| ``GET /api/health`` | ``{"status": "ok", "servers", "active_servers", "apps", "uptime_s", "version", "rpc_calls", ...}`` (below) |

``/api/health`` also shows the admission counters: ``max_servers``, ``server_id_conflicts`` (each
conflict counted once) and ``heartbeats_refused`` (refused heartbeats by kind).

Every route that changes state is wrapped in ``admin_auth.guard`` (``transport.admin_auth``): 403
and the reason while no admin credential is configured, 401 for a missing or wrong one. The
read-only routes stay open. Times are epoch milliseconds (``*_ms``), sizes bytes.

An adapter like the gRPC one: each route calls ``CoordinatorService`` (``coordinator.service``)
and encodes its typed answer. It does not cover: the decisions (the service) or the gRPC API
(``transport.coordinator_grpc``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from riffle_actors import __version__
from riffle_actors.coordinator.actors import UnknownServerError
from riffle_actors.coordinator.apps import AppView
from riffle_actors.coordinator.cluster import ServerStatus, ServerView
from riffle_actors.coordinator.service import CoordinatorService
from riffle_actors.credentials import AdminCredentials
from riffle_actors.errors import InvalidRequestError
from riffle_actors.transport.admin_auth import guard


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
        "tags": sorted(n.tags),
        "used_memory": n.used_memory,
        "pre_allocated_memory": n.pre_allocated_memory,
        "available_memory": n.available_memory,
        "event_num_in_flush": n.event_num_in_flush,
        "assigned_partitions": v.assigned_partitions,
        "total_assigned_partitions": v.total_assigned_partitions,
        "app_count": len(n.app_ids),
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


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status=status)


def build_app(
    *,
    service: CoordinatorService,
    rpc_calls: Callable[[], dict[str, int]],
    uptime_s: Callable[[], float],
    auth: AdminCredentials,
) -> web.Application:
    """The aiohttp application; the caller runs it (``runtime.Coordinator``)."""

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
            view = await service.set_server_status(sid, status)
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
        views = await service.list_servers()
        live = await service.list_apps()
        registry = await service.registry_stats()
        return _json(
            {
                "status": "ok",
                "servers": len(views),
                "active_servers": sum(1 for v in views if v.status is ServerStatus.ACTIVE),
                "apps": len(live),
                "uptime_s": round(uptime_s(), 3),
                "version": __version__,
                "rpc_calls": dict(sorted(rpc_calls().items())),
                "max_servers": registry["max_servers"],
                "server_id_conflicts": registry["id_conflicts_total"],
                "heartbeats_refused": dict(sorted(service.heartbeats_refused.items())),
            }
        )

    app = web.Application()
    app.router.add_get("/api/servers", servers)
    app.router.add_get("/api/servers/{id}", server)
    app.router.add_post("/api/servers/{id}/status", guard(auth, set_status))  # the only state-changing route
    app.router.add_get("/api/apps", apps)
    app.router.add_get("/api/historical_apps", historical_apps)
    app.router.add_get("/api/health", health)
    return app
