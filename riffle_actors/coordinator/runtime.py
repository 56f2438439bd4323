"""Composition root of the coordinator: actors + gRPC server + HTTP server, started and stopped together.

``Coordinator(cfg, clock=...)`` builds, on ``await start()``:

- an ``ActorSystem`` whose root supervisor keeps ``ClusterActor`` and ``AppRegistryActor``
  alive (PERMANENT; a restarted incarnation wraps the same registry object, so a crash loses
  no membership);
- ``CoordinatorService``, the use cases both adapters call;
- a grpc.aio server with the ``CoordinatorServicer`` adapter (``transport.coordinator_grpc``) on
  exactly ``grpc_bind_address:grpc_port``
  (0 = any free port; the send limit is raised because a large shuffle's assignment exceeds
  gRPC's 4 MiB default, the receive limit stays small: no request needs more);
- an aiohttp site with ``transport.coordinator_http.build_app`` on exactly
  ``http_bind_address:http_port``, its
  state-changing routes guarded by the admin credentials (``cfg.admin_auth()``), its ``/metrics``
  read from ``coordinator.metrics.CoordinatorMetrics``;
- with ``[metrics] push_gateway_endpoint`` set, a task pushing those metrics to the Pushgateway
  (``metrics_push.MetricsPusher``, job ``riffle-coordinator``).

A port that cannot be opened raises ``transport.listen.ListenError`` (an ``OSError`` naming the
port and its config keys), which the daemon logs as one line before exiting 1. The bound ports
are ``grpc_port`` / ``http_port`` after start. ``stop()`` closes the listeners (in-flight RPCs
get a short grace) and then stops every actor. Use it as ``async with``.

It does not cover: command-line handling, logging or signals (``main.py`` via ``daemon.py``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from typing import Self

import grpc
from aiohttp import web
from loguru import logger

from riffle_actors import __version__
from riffle_actors.coordinator.actors import AppRegistryActor, ClusterActor
from riffle_actors.coordinator.apps import AppRegistry
from riffle_actors.coordinator.cluster import ClusterRegistry, ExcludeFile, ServerView
from riffle_actors.coordinator.config import CoordinatorConfig
from riffle_actors.coordinator.metrics import CoordinatorMetrics
from riffle_actors.coordinator.service import CoordinatorService
from riffle_actors.credentials import AdminCredentials
from riffle_actors.metrics_push import COORDINATOR_JOB, MetricsPusher
from riffle_actors.runtime import ActorRef, ActorSystem, ChildSpec, Clock, RestartPolicy, SystemClock
from riffle_actors.transport.coordinator_grpc import CoordinatorServicer, add_coordinator_servicer
from riffle_actors.transport.coordinator_http import REFRESH_METRICS, build_app, flatten_config
from riffle_actors.transport.listen import bind_grpc, start_tcp_site
from riffle_actors.transport.server_internal import tell_server

#: How long a decommission at the coordinator waits for the server's own answer.
TELL_SERVER_TIMEOUT_S = 3.0

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 16 << 20),  # heartbeats and assignment requests are small
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.so_reuseport", 0),  # a port held by another process must fail, not be shared
]


class Coordinator:
    """See the module docstring."""

    def __init__(self, cfg: CoordinatorConfig, *, clock: Clock | None = None):
        self.cfg = cfg
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.admin: AdminCredentials = cfg.admin_auth()
        self.cluster = ClusterRegistry(
            clock=self.clock,
            heartbeat_timeout_s=cfg.server.heartbeat_timeout_sec,
            strategy=cfg.assignment_strategy,
            host_strategy=cfg.assignment_host_strategy,
            max_servers=cfg.max_assignment_servers,
            capacity=cfg.server.max_servers,
            max_per_host=cfg.server.max_servers_per_host,
        )
        self.apps = AppRegistry(
            clock=self.clock, heartbeat_timeout_s=cfg.app.heartbeat_timeout_sec, history_size=cfg.app.history_size,
            max_apps=cfg.app.max_apps,
        )
        self.system = ActorSystem(clock=self.clock)
        self.cluster_ref: ActorRef | None = None
        self.apps_ref: ActorRef | None = None
        self.service: CoordinatorService | None = None
        self.servicer: CoordinatorServicer | None = None
        self.grpc_port = 0
        self.http_port = 0
        self._grpc: grpc.aio.Server | None = None
        self._http: web.AppRunner | None = None
        self._started_at = 0.0
        self._started_epoch_ms = 0
        self.metrics = CoordinatorMetrics()
        self.pusher: MetricsPusher | None = None
        self._push_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        cfg, clock = self.cfg, self.clock
        self._started_at = clock.monotonic()
        self._started_epoch_ms = int(clock.time() * 1000)
        exclude = ExcludeFile(cfg.exclude_nodes_file) if cfg.exclude_nodes_file else None
        self.cluster_ref = await self.system.start_child(
            None,
            ChildSpec(
                "cluster",
                lambda: ClusterActor(
                    self.cluster,
                    clock=clock,
                    tick_interval_s=cfg.expiry_check_interval_sec,
                    exclude_file=exclude,
                    exclude_check_interval_s=cfg.exclude_nodes_check_interval_sec,
                ),
                RestartPolicy.PERMANENT,
            ),
        )
        self.apps_ref = await self.system.start_child(
            None,
            ChildSpec(
                "apps",
                lambda: AppRegistryActor(self.apps, clock=clock, tick_interval_s=cfg.expiry_check_interval_sec),
                RestartPolicy.PERMANENT,
            ),
        )
        try:
            self.service = CoordinatorService(cfg, cluster_ref=self.cluster_ref, apps_ref=self.apps_ref)
            servicer = self.servicer = CoordinatorServicer(self.service)
            self._grpc = grpc.aio.server(options=GRPC_OPTIONS)
            add_coordinator_servicer(servicer, self._grpc)
            self.grpc_port = bind_grpc(
                self._grpc, what="gRPC", keys="grpc_port / grpc_bind_address",
                host=cfg.grpc_bind_address, port=cfg.grpc_port,
            )
            await self._grpc.start()

            app = build_app(
                service=self.service,
                rpc_calls=lambda: dict(servicer.rpc_calls),
                uptime_s=lambda: clock.monotonic() - self._started_at,
                auth=self.admin,
                metrics=self.metrics,
                info=self._info,
                config_items=lambda: flatten_config(cfg.model_dump(mode="json")),
                tell_server=self._tell_server,
            )
            self._http = web.AppRunner(app, access_log=None, handle_signals=False)
            await self._http.setup()
            self.http_port = await start_tcp_site(
                self._http, what="the HTTP API", keys="http_port / http_bind_address",
                host=cfg.http_bind_address, port=cfg.http_port,
            )
            if cfg.metrics.push_gateway_endpoint:
                self.pusher = MetricsPusher(
                    cfg.metrics, registry=self.metrics.registry, job=COORDINATOR_JOB,
                    grouping={"instance": f"{cfg.grpc_bind_address}:{self.grpc_port}", "version": __version__},
                    refresh=app[REFRESH_METRICS], clock=clock)
                self._push_task = asyncio.create_task(self.pusher.run(), name="metrics-push")
        except BaseException:
            await self.stop()
            raise
        logger.info(
            "coordinator up: grpc {}:{} http {}:{} (strategy {}, hosts {})",
            cfg.grpc_bind_address, self.grpc_port, cfg.http_bind_address, self.http_port,
            cfg.assignment_strategy.value, cfg.assignment_host_strategy.value,
        )
        if self.admin.configured:
            logger.info("HTTP admin endpoints need credentials ({})", _schemes(self.admin))
        else:
            logger.info("HTTP admin endpoints are disabled: no admin credentials are configured")

    async def _tell_server(self, view: ServerView, action: str) -> tuple[bool, str]:
        """The server's ``ShuffleServerInternal.<action>``, with this coordinator's admin credentials
        (so servers and coordinator share them, e.g. one ``RIFFLE_ADMIN_TOKEN``); only when
        ``tell_servers_on_decommission`` is on (the credentials go to the address the server advertised)."""
        if not self.cfg.tell_servers_on_decommission:
            return False, "not told: the coordinator's tell_servers_on_decommission is off"
        return await tell_server(view.node.ip, view.node.grpc_port, action, _authorization(self.admin),
                                 timeout_s=TELL_SERVER_TIMEOUT_S)

    def _info(self) -> dict[str, object]:
        """Uniffle's ``/api/coordinator/info`` (ports as strings, as upstream)."""
        host = self.cfg.grpc_bind_address
        return {"coordinatorId": f"{host}-{self.grpc_port}", "serverIp": host, "serverPort": str(self.grpc_port),
                "serverWebPort": str(self.http_port), "version": __version__, "gitCommitId": "",
                "startTime": self._started_epoch_ms}

    async def stop(self, grace_s: float = 1.0) -> None:
        if self._push_task is not None:
            self._push_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._push_task
            self._push_task = None
        if self._grpc is not None:
            await self._grpc.stop(grace_s)
            self._grpc = None
        if self._http is not None:
            await self._http.cleanup()
            self._http = None
        await self.system.stop_all()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _authorization(auth: AdminCredentials) -> str | None:
    """The ``Authorization`` value these credentials present (the token first)."""
    if auth.token:
        return f"Bearer {auth.token}"
    if auth.basic_user and auth.basic_password:
        return "Basic " + base64.b64encode(f"{auth.basic_user}:{auth.basic_password}".encode()).decode()
    return None


def _schemes(auth: AdminCredentials) -> str:
    return " or ".join(s for s, on in (("Bearer token", auth.token), ("HTTP Basic", auth.basic_user)) if on)
