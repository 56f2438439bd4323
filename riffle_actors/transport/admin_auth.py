"""The HTTP guard of the endpoints that change state, shared by both daemons' HTTP adapters.

This module owns the aiohttp wrapper ``guard(credentials, handler)`` that checks a request against
the resolved ``AdminCredentials`` (``riffle_actors.credentials``: resolving and constant-time
checking) and answers:

- **403** with the reason when no credential is configured at all: admin actions are off until
  an operator turns them on (safe by default);
- **401** with ``WWW-Authenticate`` when credentials are configured but the request carries none
  or wrong ones;
- the handler's own answer otherwise.

Read-only endpoints are not wrapped (as upstream: ``/metrics``, ``/health`` and the listings stay
open; bind the HTTP port to loopback to hide them). Every refusal and every authorized action is
logged with the peer address and the path, never with the presented secret.

It does not cover: resolving the credentials (``riffle_actors.credentials``), which endpoints are
admin ones (each adapter decides) or TLS.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from loguru import logger

from riffle_actors.credentials import ENV_TOKEN, AdminCredentials

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def guard(credentials: AdminCredentials, handler: Handler) -> Handler:
    """Wrap an aiohttp handler so that it runs only for an authorized request."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        where = f"{request.method} {request.path} from {request.remote}"
        if not credentials.configured:
            logger.warning("refused admin request {}: no admin credentials are configured", where)
            return _refusal(403, "admin actions are disabled: no credentials are configured; set "
                                 f"{ENV_TOKEN} (or [admin] token / token_file, or basic_user and "
                                 "basic_password) and restart")
        if not credentials.check(request.headers.get("Authorization")):
            logger.warning("refused admin request {}: missing or wrong credentials", where)
            return _refusal(401, "admin credentials required: send 'Authorization: Bearer <token>' or "
                                 "HTTP Basic credentials", challenge=True)
        logger.info("admin request {}", where)
        return await handler(request)

    guarded.__name__ = getattr(handler, "__name__", "guarded")
    return guarded


def _refusal(status: int, message: str, *, challenge: bool = False) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="riffle", Basic realm="riffle"'} if challenge else None
    return web.Response(body=orjson.dumps({"error": message}), status=status, content_type="application/json",
                        headers=headers)
