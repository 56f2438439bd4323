"""Admin credentials of the daemons' state-changing HTTP endpoints: resolving and checking them.

This module owns resolving the admin credentials from ``[admin]`` and the environment
(``RIFFLE_ADMIN_TOKEN``, ``RIFFLE_ADMIN_USER``, ``RIFFLE_ADMIN_PASSWORD``; the environment wins)
into an ``AdminCredentials`` value, refusing unusable ones (``AdminCredentialError``: an
unreadable ``token_file``, too short a secret), and checking a request's ``Authorization`` header
against them in constant time. Pure apart from reading the token file and the environment once.

It does not cover: answering HTTP requests (``riffle_actors.transport.admin_auth.guard`` wraps a
handler with these checks) or which endpoints are admin ones (each adapter decides).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass

from riffle_actors.config import AdminConfig

ENV_TOKEN = "RIFFLE_ADMIN_TOKEN"
ENV_USER = "RIFFLE_ADMIN_USER"
ENV_PASSWORD = "RIFFLE_ADMIN_PASSWORD"

class AdminCredentialError(ValueError):
    """The configured credentials cannot be used (unreadable token file, too short a secret)."""


@dataclass(frozen=True, slots=True)
class AdminCredentials:
    """The resolved credentials; ``configured`` is False when none is set."""

    token: str | None = None
    basic_user: str | None = None
    basic_password: str | None = None

    @property
    def configured(self) -> bool:
        return bool(self.token) or bool(self.basic_user and self.basic_password)

    @classmethod
    def resolve(cls, cfg: AdminConfig | None, environ: Mapping[str, str] | None = None) -> AdminCredentials:
        """Credentials from the config section, overridden by the environment."""
        env = os.environ if environ is None else environ
        cfg = cfg or AdminConfig()
        token = cfg.token
        if cfg.token_file:
            try:
                with open(cfg.token_file, encoding="utf-8") as f:
                    token = f.readline().strip()
            except OSError as e:
                raise AdminCredentialError(
                    f"admin.token_file: cannot read {cfg.token_file}: {e.strerror}") from None
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
