"""The coordinator's HTTP API as ``riffle-ctl`` uses it (``urllib``: one short request per call).

The coordinator address comes from ``--coordinator`` or ``RIFFLE_COORDINATOR`` (``http://host:port``
of its HTTP API; a bare ``host:port`` gets ``http://``). Admin calls send the credentials of
``riffle_actors.credentials``: ``RIFFLE_ADMIN_TOKEN`` as a Bearer token, else
``RIFFLE_ADMIN_USER`` / ``RIFFLE_ADMIN_PASSWORD`` as HTTP Basic.

``--coordinator NAME`` resolves through the named clusters of ``config init --file FILE``
(Riffle's ``meta.rs``): ``FILE`` is TOML, ``[[clusters]]`` tables of ``cluster_id`` and
``coordinator_url``; ``config init`` checks it and records its path in ``~/.riffle/meta.file``
(``$HOME``; ``/tmp`` without one), which every later run reads.

``ServerHttp`` is one shuffle server's HTTP port (its ``/admin`` routes in Riffle's query form:
``get_state``, ``update_state``, tags, kill), addressed as ``IP:HTTP_PORT`` (``--instance``, or
``ip`` and ``http_port`` of a pipeline line); it gets the same credentials.
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


#: the named clusters file may hold at most this many bytes
MAX_CLUSTERS_FILE_BYTES = 1 << 20


def meta_file_path() -> str:
    home = os.environ.get("HOME") or "/tmp"
    return os.path.join(home, ".riffle", "meta.file")


def load_clusters(path: str) -> dict[str, str]:
    """``cluster_id -> coordinator_url`` of a clusters file; raises ``CtlError`` naming the problem."""
    import tomllib

    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CLUSTERS_FILE_BYTES + 1)
    except OSError as e:
        raise CtlError(f"cannot read the clusters file {path}: {e.strerror or e}") from None
    if len(raw) > MAX_CLUSTERS_FILE_BYTES:
        raise CtlError(f"{path}: larger than {MAX_CLUSTERS_FILE_BYTES} bytes")
    try:
        doc = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise CtlError(f"{path}: not TOML: {e}") from None
    clusters = doc.get("clusters")
    if not isinstance(clusters, list):
        raise CtlError(f'{path}: needs [[clusters]] tables of cluster_id and coordinator_url, e.g.\n'
                       f'[[clusters]]\ncluster_id = "production"\ncoordinator_url = "http://host:21001"')
    out: dict[str, str] = {}
    for i, c in enumerate(clusters):
        if not (isinstance(c, dict) and isinstance(c.get("cluster_id"), str) and
                isinstance(c.get("coordinator_url"), str) and c["cluster_id"]):
            raise CtlError(f"{path}: clusters[{i}] needs cluster_id and coordinator_url (strings)")
        out[c["cluster_id"]] = c["coordinator_url"]
    return out


def init_clusters(path: str) -> tuple[str, dict[str, str]]:
    """``config init --file``: check the file, record its absolute path; returns (meta file, clusters)."""
    path = os.path.abspath(path)
    clusters = load_clusters(path)
    meta = meta_file_path()
    os.makedirs(os.path.dirname(meta), exist_ok=True)
    with open(meta, "w", encoding="utf-8") as f:
        f.write(path)
    return meta, clusters


def named_clusters() -> tuple[str | None, dict[str, str]]:
    """The clusters of the recorded file (``(None, {})`` when ``config init`` never ran)."""
    try:
        with open(meta_file_path(), encoding="utf-8") as f:
            path = f.read(4096).strip()
    except OSError:
        return None, {}
    return path, load_clusters(path)


def coordinator_url(arg: str | None) -> str:
    """``--coordinator``: a named cluster, a URL, or ``host:port``; absent: ``$RIFFLE_COORDINATOR``."""
    url = arg or os.environ.get(ENV_COORDINATOR) or DEFAULT_COORDINATOR
    if "://" not in url:
        path, clusters = named_clusters()
        if url in clusters:
            url = clusters[url]
        elif ":" not in url:
            known = f"; the clusters of {path}: {', '.join(sorted(clusters)) or '-'}" if path else \
                "; no clusters file is set up (riffle-ctl config init --file FILE)"
            raise CtlError(f"unknown cluster {url!r}: pass a URL (http://host:port) or a cluster id{known}", code=2)
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

    def riffle(self, query: str) -> str:
        """``POST /admin?<query>`` (Riffle's form, admin credentials): the server's text answer."""
        return _request(self.url, "POST", "/admin?" + query, None, True, self.timeout_s,
                        lambda reason: f"cannot reach the server at {self.url} ({reason})", raw=True,
                        unreachable_cls=ServerUnreachable)

    def state(self) -> dict[str, Any]:
        """``GET /admin``: lifecycle status, app count, tags and Riffle's state name."""
        return _request(self.url, "GET", "/admin", None, False, self.timeout_s,
                        lambda reason: f"cannot reach the server at {self.url} ({reason})",
                        unreachable_cls=ServerUnreachable)

    def admin(self, action: str) -> dict[str, Any]:
        """``POST /admin/<action>`` (kill, decommission, cancel_decommission): the server's answer.
        A 409 (the action does not apply) is an answer too, with ``ok`` false."""
        return _request(self.url, "POST", "/admin/" + action, None, True, self.timeout_s,
                        lambda reason: f"cannot reach the server at {self.url} ({reason})", body_on_409=True)


class ServerUnreachable(CtlError):
    """A server's HTTP port did not answer."""


def _request(base: str, method: str, path: str, body: Any, admin: bool, timeout_s: float,
             unreachable: Any, *, body_on_409: bool = False, raw: bool = False,
             unreachable_cls: type[CtlError] | None = None) -> Any:
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
            answer = response.read(1 << 24)
            if raw:
                return answer.decode(errors="replace").strip()
            try:
                return json.loads(answer or b"null")
            except ValueError:
                raise CtlError(f"{method} {base}{path}: the answer is not JSON: "
                               f"{answer[:80].decode(errors='replace')!r}") from None
    except urllib.error.HTTPError as e:
        body_bytes = e.read(1 << 16)
        try:
            parsed = json.loads(body_bytes)
        except ValueError:
            parsed = None
        if body_on_409 and e.code == 409 and isinstance(parsed, dict):
            return parsed
        detail = parsed.get("error", "") if isinstance(parsed, dict) else \
            body_bytes.decode(errors="replace").strip()[:300]
        raise HttpError(e.code, f"{method} {path}: HTTP {e.code}" + (f": {detail}" if detail else "")) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        cls = unreachable_cls or (ServerUnreachable if body_on_409 else CtlError)
        raise cls(unreachable(reason)) from None


class HttpError(CtlError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
