"""Credentials for the HTTP endpoints that change state, shared by both daemons' HTTP adapters.

This module owns: resolving the admin credentials from ``[admin]`` and the environment
(``RIFFLE_ADMIN_TOKEN``, ``RIFFLE_ADMIN_USER``, ``RIFFLE_ADMIN_PASSWORD``; the environment wins),
checking a request's ``Authorization`` header against them in constant time, and the aiohttp
wrapper ``AdminAuth.guard(handler)`` that answers:

- **403** with the reason when no credential is configured at all: admin actions are off until
  an operator turns them on (safe by default);
- **401** with ``WWW-Authenticate`` when credentials are configured but the request carries none
  or wrong ones;
- the handler's own answer otherwise.

Read-only endpoints are not wrapped (as upstream: ``/metrics``, ``/health`` and the listings stay
open; bind the HTTP port to loopback to hide them). Every refusal and every authorized action is
logged with the peer address and the path, never with the presented secret.

It does not cover: which endpoints are admin ones (each adapter decides) or TLS.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import orjson
from aiohttp import web
from loguru import logger

from riffle_actors.config import AdminConfig

ENV_TOKEN = "RIFFLE_ADMIN_TOKEN"
ENV_USER = "RIFFLE_ADMIN_USER"
ENV_PASSWORD = "RIFFLE_ADMIN_PASSWORD"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AdminCredentialError(ValueError):
    """The configured credentials cannot be used (unreadable token file, too short a secret)."""


@dataclass(frozen=True, slots=True)
class AdminAuth:
    """The resolved credentials; ``configured`` is False when none is set."""

    token: str | None = None
    basic_user: str | None = None
    basic_password: str | None = None

    @property
    def configured(self) -> bool:
        return bool(self.token) or bool(self.basic_user and self.basic_password)

    @classmethod
    def resolve(cls, cfg: AdminConfig | None, environ: Mapping[str, str] | None = None) -> AdminAuth:
        """Credentials from the config section, overridden by the environment."""
        env = os.environ if environ is None else environ
        cfg = cfg or AdminConfig()
        token = cfg.token
        if cfg.token_file:
            try:
                with open(cfg.token_file, encoding="utf-8") as f:
                    token = f.readline().strip()
            except OSError as e:
                raise AdminCredentialError(f"admin.token_file: cannot read {cfg.token_file}: {e.strerror}") from None
            if not token:
                raise AdminCredentialError(f"admin.token_file: {cfg.token_file} is empty")
        token = env.get(ENV_TOKEN) or token
        user = env.get(ENV_USER) or cfg.basic_user
        password = env.get(ENV_PASSWORD) or cfg.basic_password
        if token is not None and len(token) < 16:
            raise AdminCredentialError(f"the admin token ({ENV_TOKEN} or admin.token_file) must be at least "
                                       f"16 characters")
        if (user is None) != (password is None):
            raise AdminCredentialError(f"{ENV_USER} and {ENV_PASSWORD} (or admin.basic_user and "
                                       f"admin.basic_password) go together")
        if password is not None and len(password) < 12:
            raise AdminCredentialError("the admin password must be at least 12 characters")
        return cls(token=token or None, basic_user=user, basic_password=password)

    def check(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header value grants admin rights."""
        if not authorization or not self.configured:
            return False
        scheme, _, value = authorization.strip().partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer" and self.token:
            return hmac.compare_digest(value.encode(), self.token.encode())
        if scheme.lower() == "basic" and self.basic_user and self.basic_password:
            try:
                user, sep, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return False
            # both compared, always, so the time taken does not tell which one was wrong
            ok_user = hmac.compare_digest(user.encode(), self.basic_user.encode())
            ok_password = hmac.compare_digest(password.encode(), self.basic_password.encode())
            return bool(sep) and ok_user and ok_password
        return False

    def guard(self, handler: Handler) -> Handler:
        """Wrap an aiohttp handler so that it runs only for an authorized request."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            where = f"{request.method} {request.path} from {request.remote}"
            if not self.configured:
                logger.warning("refused admin request {}: no admin credentials are configured", where)
                return _refusal(403, "admin actions are disabled: no credentials are configured; set "
                                     f"{ENV_TOKEN} (or [admin] token / token_file, or basic_user and "
                                     "basic_password) and restart")
            if not self.check(request.headers.get("Authorization")):
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
