"""The coordinator's HTTP API as ``riffle-ctl`` uses it (``urllib``: one short request per call).

The coordinator address comes from ``--coordinator`` or ``RIFFLE_COORDINATOR`` (``http://host:port``
of its HTTP API; a bare ``host:port`` gets ``http://``). Admin calls send the credentials of
``riffle_actors.credentials``: ``RIFFLE_ADMIN_TOKEN`` as a Bearer token, else
``RIFFLE_ADMIN_USER`` / ``RIFFLE_ADMIN_PASSWORD`` as HTTP Basic.
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
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if admin:
            auth = _auth_header()
            if auth is None:
                raise CtlError(f"this command changes the cluster: set {ENV_TOKEN} (or {ENV_USER} and "
                               f"{ENV_PASSWORD}) to the coordinator's admin credentials")
            headers["Authorization"] = auth
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as e:
            try:
                detail = json.loads(e.read()).get("error", "")
            except (ValueError, AttributeError):
                detail = ""
            raise HttpError(e.code, f"{method} {path}: HTTP {e.code}" + (f": {detail}" if detail else "")) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise CtlError(f"cannot reach the coordinator at {self.url} ({reason}); set --coordinator or "
                           f"{ENV_COORDINATOR}") from None

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


class HttpError(CtlError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
