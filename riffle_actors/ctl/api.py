"""The coordinator's HTTP API as ``riffle-ctl`` uses it (``urllib``: one short request per call).

The coordinator address comes from ``--coordinator`` or ``RIFFLE_COORDINATOR`` (``http://host:port``
of its HTTP API; a bare ``host:port`` gets ``http://``). Admin calls send the credentials of
``riffle_actors.credentials``: ``RIFFLE_ADMIN_TOKEN`` as a Bearer token, else
``RIFFLE_ADMIN_USER`` / ``RIFFLE_ADMIN_PASSWORD`` as HTTP Basic.

``ServerHttp`` is one shuffle server's HTTP port (its ``/admin`` routes: kill), found from the
coordinator's listing (``ip`` and ``http_port``); it gets the same credentials.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from riffle_actors.credentials import ENV_PASSWORD, ENV_TOKEN, ENV_USER

ENV_COORDINATOR = "RIFFLE_COORDINATOR"
DEFAULT_COORDINATOR = "http://127.0.0.1:21001"


class CtlError(Exception):
    """A failure to report as one line (exit status 1, or ``code``)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def coordinator_url(arg: str | None) -> str:
    url = arg or os.environ.get(ENV_COORDINATOR) or DEFAULT_COORDINATOR
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


def _auth_header() -> str | None:
    token = os.environ.get(ENV_TOKEN)
    if token:
        return f"Bearer {token}"
    user, password = os.environ.get(ENV_USER), os.environ.get(ENV_PASSWORD)
    if user and password:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    return None


class Coordinator:
    """One coordinator's HTTP API."""

    def __init__(self, url: str, timeout_s: float = 10.0):
        self.url = url
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: Any = None, admin: bool = False) -> Any:
        return _request(self.url, method, path, body, admin, self.timeout_s,
                        lambda reason: f"cannot reach the coordinator at {self.url} ({reason}); set --coordinator "
                                       f"or {ENV_COORDINATOR}")

    def servers(self) -> list[dict[str, Any]]:
        return self._call("GET", "/api/servers")

    def server(self, server_id: str) -> dict[str, Any]:
        return self._call("GET", "/api/servers/" + urllib.parse.quote(server_id, safe=""))

    def apps(self) -> list[dict[str, Any]]:
        return self._call("GET", "/api/apps")

    def historical_apps(self) -> list[dict[str, Any]]:
        return self._call("GET", "/api/historical_apps")

    def set_status(self, server_id: str, status: str) -> dict[str, Any]:
        return self._call("POST", f"/api/servers/{urllib.parse.quote(server_id, safe='')}/status",
                          {"status": status}, admin=True)

    def set_tags(self, server_id: str, add: list[str], remove: list[str]) -> dict[str, Any]:
        return self._call("POST", f"/api/servers/{urllib.parse.quote(server_id, safe='')}/tags",
                          {"add": add, "remove": remove}, admin=True)


class ServerHttp:
    """One shuffle server's HTTP port."""

    def __init__(self, ip: str, http_port: int, timeout_s: float = 10.0):
        host = f"[{ip}]" if ":" in ip else ip
        self.url = f"http://{host}:{http_port}"
        self.timeout_s = timeout_s

    def admin(self, action: str) -> dict[str, Any]:
        """``POST /admin/<action>`` (kill, decommission, cancel_decommission): the server's answer.
        A 409 (the action does not apply) is an answer too, with ``ok`` false."""
        return _request(self.url, "POST", "/admin/" + action, None, True, self.timeout_s,
                        lambda reason: f"cannot reach the server at {self.url} ({reason})", body_on_409=True)


class ServerUnreachable(CtlError):
    """A server's HTTP port did not answer."""


def _request(base: str, method: str, path: str, body: Any, admin: bool, timeout_s: float,
             unreachable: Any, *, body_on_409: bool = False) -> Any:
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if admin:
        auth = _auth_header()
        if auth is None:
            raise CtlError(f"this command changes the cluster: set {ENV_TOKEN} (or {ENV_USER} and "
                           f"{ENV_PASSWORD}) to the admin credentials")
        headers["Authorization"] = auth
    request = urllib.request.Request(base + path, data=data if data is not None else (b"" if method == "POST" else None),
                                     method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if body_on_409 and e.code == 409 and isinstance(parsed, dict):
            return parsed
        detail = parsed.get("error", "") if isinstance(parsed, dict) else ""
        raise HttpError(e.code, f"{method} {path}: HTTP {e.code}" + (f": {detail}" if detail else "")) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        cls = ServerUnreachable if body_on_409 else CtlError
        raise cls(unreachable(reason)) from None


class HttpError(CtlError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
