"""CoordinatorAdmin: what riffle-coordinator says about itself (health, metrics, identity, config).

The counterpart of the shuffle server's ``riffle_actors.admin``, next to ``CoordinatorService``
(the use cases): the HTTP adapter (``riffle_actors.transport.coordinator_http``) and the
Pushgateway pusher depend on it, never on the composition root. It owns:

- **health**: ``health()`` gathers a ``CoordinatorHealth`` (typed) from the state actors and the
  ``CoordinatorCounters``: servers, ACTIVE servers, live apps, uptime, version, gRPC calls by
  method, the admission counters (``max_servers``, id conflicts, refused heartbeats and driver
  requests by kind);
- **the metrics snapshot**: ``refresh_metrics()`` fills ``CoordinatorMetrics.snapshot`` (what a
  scrape or a push reads); ``render_metrics()`` refreshes and renders the Prometheus text;
- **identity**: ``info()`` is Uniffle's ``/api/coordinator/info`` as a ``CoordinatorInfo``, once
  the composition root set ``identity`` (the bound ports);
- **config**: ``config_items(privileged)`` is the config as sorted dotted ``(key, value)`` pairs
  (``flatten_config``: the ``[admin]`` section left out, credentials in URLs masked), with the
  values of ``REDACTED_KEYS`` masked unless the caller presented the admin credentials
  (``redact_config``).

It owns no state but ``identity``: the actors and counters it reads do.

It does not cover: JSON (the adapter), the use cases (``service.py``) or wiring
(``riffle_actors.coordinator_server``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson

from riffle_actors import __version__
from riffle_actors.coordinator import actors as msgs
from riffle_actors.coordinator.apps import AppStats, AppView
from riffle_actors.coordinator.cluster import RegistryStats, ServerStatus, ServerView
from riffle_actors.coordinator.metrics import CoordinatorMetrics
from riffle_actors.runtime import ActorRef, Clock

#: Config items whose values are secrets for anyone without admin credentials (Hadoop conf: keys, tokens).
REDACTED_KEYS = ("remote_storage.conf",)
REDACTED = "******"


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordinatorHealth:
    """``/api/health``: what the coordinator holds and what it refused (maps sorted by key)."""

    servers: int
    active_servers: int
    apps: int
    uptime_s: float  # rounded to the millisecond
    version: str
    rpc_calls: dict[str, int]
    max_servers: int
    server_id_conflicts: int
    heartbeats_refused: dict[str, int]
    requests_refused: dict[str, int]
    status: str = "ok"


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordinatorIdentity:
    """How the coordinator presents itself (known once its ports are bound)."""

    host: str  # grpc_bind_address
    grpc_port: int
    http_port: int
    start_time_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordinatorInfo:
    """Uniffle's ``/api/coordinator/info`` (ports as strings, as upstream)."""

    coordinator_id: str
    server_ip: str
    server_port: str
    server_web_port: str
    version: str
    git_commit_id: str
    start_time_ms: int


class CoordinatorAdmin:
    """See the module docstring. ``config``: the loaded config as JSON-able data (``model_dump``)."""

    def __init__(self, *, clock: Clock, metrics: CoordinatorMetrics, cluster_ref: ActorRef, apps_ref: ActorRef,
                 config: dict[str, Any], started_monotonic: float):
        self.clock = clock
        self.metrics = metrics
        self.cluster_ref = cluster_ref
        self.apps_ref = apps_ref
        self._config_items = flatten_config(config)
        self.started_monotonic = started_monotonic
        self.identity: CoordinatorIdentity | None = None

    def uptime_s(self) -> float:
        return self.clock.monotonic() - self.started_monotonic

    async def _servers(self) -> list[ServerView]:
        views: list[ServerView] = await self.cluster_ref.ask(msgs.ListServers())
        return views

    async def _registry_stats(self) -> RegistryStats:
        stats: RegistryStats = await self.cluster_ref.ask(msgs.GetRegistryStats())
        return stats

    async def _app_stats(self) -> AppStats:
        stats: AppStats = await self.apps_ref.ask(msgs.GetAppStats())
        return stats

    # ------------------------------------------------------------- health
    async def health(self) -> CoordinatorHealth:
        views = await self._servers()
        live: list[AppView] = await self.apps_ref.ask(msgs.ListKnownApps())
        registry = await self._registry_stats()
        c = self.metrics.counters
        return CoordinatorHealth(
            servers=len(views),
            active_servers=sum(1 for v in views if v.status is ServerStatus.ACTIVE),
            apps=len(live),
            uptime_s=round(self.uptime_s(), 3),
            version=__version__,
            rpc_calls=dict(sorted(c.rpc_calls.items())),
            max_servers=registry.max_servers,
            server_id_conflicts=registry.id_conflicts_total,
            heartbeats_refused=dict(sorted(c.heartbeats_refused.items())),
            requests_refused=dict(sorted(c.requests_refused.items())),
        )

    # ------------------------------------------------------------- metrics snapshot
    async def refresh_metrics(self) -> None:
        """Fill the metrics snapshot from the actors and counters (what a scrape or a push reads)."""
        views = await self._servers()
        app_stats = await self._app_stats()
        registry = await self._registry_stats()
        c = self.metrics.counters
        by_status = Counter(v.status.name for v in views)
        s = self.metrics.snapshot
        s.servers_by_status = {st.name: by_status.get(st.name, 0) for st in ServerStatus}
        s.heartbeat_ages_s = [v.heartbeat_age_s for v in views]
        s.servers_lost_total = registry.lost_total
        s.heartbeats_refused = dict(c.heartbeats_refused)
        s.assignments_total = c.assignments_total
        s.assignment_failures_total = c.assignment_failures_total
        s.assigned_partitions_total = c.assigned_partitions_total
        s.apps, s.historical_apps = app_stats.active, app_stats.historical
        s.apps_registered_total, s.apps_expired_total = app_stats.registered_total, app_stats.expired_total
        s.rpc_calls = dict(c.rpc_calls)
        s.uptime_s = self.uptime_s()

    async def render_metrics(self) -> bytes:
        """Prometheus text, refreshed first."""
        await self.refresh_metrics()
        return self.metrics.render()

    # ------------------------------------------------------------- identity and config
    def info(self) -> CoordinatorInfo | None:
        """Uniffle's ``/api/coordinator/info``; None before the ports are bound."""
        ident = self.identity
        if ident is None:
            return None
        return CoordinatorInfo(
            coordinator_id=f"{ident.host}-{ident.grpc_port}", server_ip=ident.host,
            server_port=str(ident.grpc_port), server_web_port=str(ident.http_port), version=__version__,
            git_commit_id="", start_time_ms=ident.start_time_ms)

    def config_items(self, *, privileged: bool) -> list[tuple[str, str]]:
        """The config as dotted keys; ``REDACTED_KEYS``' values masked unless ``privileged``."""
        return list(self._config_items) if privileged else redact_config(self._config_items)


def redact_config(items: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``items`` with the values of ``REDACTED_KEYS`` replaced (their keys still shown)."""
    out = []
    for key, value in items:
        if key in REDACTED_KEYS:
            try:
                conf = orjson.loads(value)
            except orjson.JSONDecodeError:
                conf = None
            value = (orjson.dumps({k: REDACTED for k in conf}).decode() if isinstance(conf, dict) else REDACTED)
        out.append((key, value))
    return out


def flatten_config(data: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """A config dump as sorted ``(dotted key, value)`` pairs; the ``admin`` section (secrets) is left out."""
    out: list[tuple[str, str]] = []
    for key, value in data.items():
        if not prefix and key == "admin":
            continue
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and key not in ("client_conf", "conf", "labels"):
            out.extend(flatten_config(value, dotted + "."))
        else:
            text = value if isinstance(value, str) else orjson.dumps(value).decode()
            out.append((dotted, re.sub(r"://[^/@\s]*@", "://***@", text)))  # no credentials in URLs
    return sorted(out)

