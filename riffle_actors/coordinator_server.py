"""Coordinator: the composition root of ``riffle-coordinator`` and its ``main()``.

Wiring and start/stop only, above the transports as ``riffle_actors.server`` is for the shuffle
server (so nothing in ``riffle_actors/coordinator/`` imports ``riffle_actors/transport/``).
``Coordinator(cfg, clock=...)`` builds, on ``await start()``, in this order (a
``runtime.StartSequence``, shared with the server: each step undone in the reverse order by
``stop()``, and by a start that fails half-way):

1. ``actors``: an ``ActorSystem`` whose root supervisor keeps ``TimerActor``, ``ClusterActor`` and
   ``AppRegistryActor`` alive (PERMANENT; a restarted incarnation wraps the same registry object
   and timer table, so a crash loses no membership and no schedule). The exclude-nodes file
   (``io.exclude_file``) is read once, off the loop, before any heartbeat is taken;
2. ``timers``: the periodic work on the ``TimerActor`` (no task sleeps): ``ExpireServers`` /
   ``ExpireApps`` every ``expiry_check_interval_sec``, ``PollExcludeFile`` every
   ``exclude_nodes_check_interval_sec`` (with ``exclude_nodes_file``);
3. ``grpc``: the services, ``CoordinatorService`` (the use cases) and ``CoordinatorAdmin`` (health,
   metrics, identity, config), and a grpc.aio server with the ``CoordinatorServicer`` adapter
   (``transport.coordinator_grpc``) on exactly ``grpc_bind_address:grpc_port`` (0 = any free port;
   the send limit is raised because a large shuffle's assignment exceeds gRPC's 4 MiB default, the
   receive limit stays small: no request needs more);
4. ``http``: an aiohttp site with ``transport.coordinator_http.build_app`` on exactly
   ``http_bind_address:http_port``, its state-changing routes guarded by the admin credentials
   (``cfg.admin_auth()``);
5. ``metrics-push``: with ``[metrics] push_gateway_endpoint`` set, a ``PeriodicJobActor`` the timer
   wakes to push the metrics to the Pushgateway every ``push_interval_sec`` (the first at once)
   (``metrics_push.MetricsPusher``, job ``riffle-coordinator``).

A port that cannot be opened raises ``transport.listen.ListenError`` (an ``OSError`` naming the
port and its config keys), which the daemon logs as one line before exiting 1; what had started is
stopped first (in reverse order). The bound ports are ``grpc_port`` / ``http_port`` after start. ``stop()`` closes the
listeners (in-flight RPCs get a short grace) and then stops every actor. Use it as ``async with``.

``main(argv)`` hands the command line to ``riffle_actors.daemon.run_daemon`` (``--config``,
``--daemon``, ``--pid-file``, ``--port-file``, ``stop``, ``status``) with ``serve``, which runs a
``Coordinator`` until SIGTERM/SIGINT. Entry points: the ``riffle-coordinator`` console script and
``python -m riffle_actors.coordinator`` (``coordinator/__main__.py``).

See also: ``riffle_actors.coordinator`` (the package's modules), ``docs/coordinator.md``.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Self

import grpc
from aiohttp import web
from loguru import logger

from riffle_actors import __version__
from riffle_actors.coordinator.actors import (
    AppRegistryActor,
    ClusterActor,
    ExpireApps,
    ExpireServers,
    PollExcludeFile,
    SetExcluded,
)
from riffle_actors.coordinator.admin import CoordinatorAdmin, CoordinatorIdentity
from riffle_actors.coordinator.apps import AppRegistry
from riffle_actors.coordinator.cluster import ClusterRegistry, ServerView
from riffle_actors.coordinator.config import CoordinatorConfig, load_coordinator_config
from riffle_actors.coordinator.metrics import CoordinatorMetrics
from riffle_actors.coordinator.service import CoordinatorService
from riffle_actors.credentials import AdminCredentials
from riffle_actors.daemon import PortFileWriter, run_daemon
from riffle_actors.io.exclude_file import ExcludeFile
from riffle_actors.metrics_push import COORDINATOR_JOB, MetricsPusher
from riffle_actors.runtime import (
    ActorRef,
    ActorSystem,
    ChildSpec,
    Clock,
    PeriodicJobActor,
    RestartPolicy,
    ScheduleEvery,
    StartSequence,
    Step,
    SystemClock,
    TimerActor,
    TimerTable,
)
from riffle_actors.transport.coordinator_grpc import CoordinatorServicer, add_coordinator_servicer
from riffle_actors.transport.coordinator_http import build_app
from riffle_actors.transport.listen import ListenError, bind_grpc, start_tcp_site
from riffle_actors.transport.server_internal import tell_server

#: How long a decommission at the coordinator waits for the server's own answer.
TELL_SERVER_TIMEOUT_S = 3.0

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 16 << 20),  # heartbeats and assignment requests are small
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.so_reuseport", 0),  # a port held by another process must fail, not be shared
]

METRICS_PUSH = "metrics-push"


class Coordinator:
    """See the module docstring."""

    def __init__(self, cfg: CoordinatorConfig, *, clock: Clock | None = None):
        self.cfg = cfg
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.admin_auth: AdminCredentials = cfg.admin_auth()
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
        self.exclude_file = ExcludeFile(cfg.exclude_nodes_file) if cfg.exclude_nodes_file else None
        self.metrics = CoordinatorMetrics()
        self.system = ActorSystem(clock=self.clock)
        self.timer_table = TimerTable()  # the timer's schedules survive its restarts
        self.timer_ref: ActorRef | None = None
        self.cluster_ref: ActorRef | None = None
        self.apps_ref: ActorRef | None = None
        self.service: CoordinatorService | None = None
        self.admin: CoordinatorAdmin | None = None
        self.servicer: CoordinatorServicer | None = None
        self.grpc_port = 0
        self.http_port = 0
        self._grpc: grpc.aio.Server | None = None
        self._http: web.AppRunner | None = None
        self.pusher: MetricsPusher | None = None
        self._start_time_ms = 0
        self._grace_s = 1.0
        # one ordered start with rollback and the stop in reverse order (runtime.StartSequence), as the server's
        self._sequence = StartSequence([
            Step("actors", self._start_actors, self._stop_actors),
            Step("timers", self._start_timers),  # the schedules end with the timer (``actors``)
            Step("grpc", self._start_grpc, self._stop_grpc),
            Step("http", self._start_http, self._stop_http),
            Step(METRICS_PUSH, self._start_push, self._stop_push),
        ], what="coordinator", expected_errors=(ListenError,))  # a port in use: the daemon's one line

    # ------------------------------------------------------------- start / stop
    async def start(self) -> None:
        """Every step in order; when one fails, the ones started are stopped in reverse order and it raises."""
        await self._sequence.start()
        cfg = self.cfg
        logger.info(
            "coordinator up: grpc {}:{} http {}:{} (strategy {}, hosts {})",
            cfg.grpc_bind_address, self.grpc_port, cfg.http_bind_address, self.http_port,
            cfg.assignment_strategy.value, cfg.assignment_host_strategy.value,
        )
        if self.admin_auth.configured:
            logger.info("HTTP admin endpoints need credentials ({})", _schemes(self.admin_auth))
        else:
            logger.info("HTTP admin endpoints are disabled: no admin credentials are configured")

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop the started steps in reverse order (each failure logged, the rest still stop). Idempotent."""
        self._grace_s = grace_s
        await self._sequence.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------- the steps
    async def _start_actors(self) -> None:
        started_monotonic = self.clock.monotonic()
        self._start_time_ms = int(self.clock.time() * 1000)
        system, clock, table = self.system, self.clock, self.timer_table
        try:
            self.timer_ref = await system.start_child(None, ChildSpec("timer", lambda: TimerActor(clock, table)))
            self.cluster_ref = await system.start_child(None, ChildSpec(
                "cluster", lambda: ClusterActor(self.cluster, exclude_file=self.exclude_file),
                RestartPolicy.PERMANENT))
            self.apps_ref = await system.start_child(None, ChildSpec(
                "apps", lambda: AppRegistryActor(self.apps), RestartPolicy.PERMANENT))
            if self.exclude_file is not None:  # applied before the first heartbeat is taken (gRPC starts later)
                ids = await asyncio.to_thread(self.exclude_file.poll)
                if ids is not None:
                    await self.cluster_ref.ask(SetExcluded(server_ids=ids))
        except BaseException:
            await system.stop_all()
            raise
        self.admin = CoordinatorAdmin(clock=clock, metrics=self.metrics, cluster_ref=self.cluster_ref,
                                      apps_ref=self.apps_ref, config=self.cfg.model_dump(mode="json"),
                                      started_monotonic=started_monotonic)
        self.service = CoordinatorService(self.cfg, cluster_ref=self.cluster_ref, apps_ref=self.apps_ref,
                                          counters=self.metrics.counters, tell_server=self._tell_server)

    async def _stop_actors(self) -> None:
        await self.system.stop_all()

    async def _start_timers(self) -> None:
        cfg, timer = self.cfg, self.timer_ref
        assert timer is not None and self.cluster_ref is not None and self.apps_ref is not None
        every = float(cfg.expiry_check_interval_sec)
        await timer.ask(ScheduleEvery("expire-servers", every, self.cluster_ref, ExpireServers()))
        await timer.ask(ScheduleEvery("expire-apps", every, self.apps_ref, ExpireApps()))
        if self.exclude_file is not None:
            await timer.ask(ScheduleEvery("poll-exclude-file", float(cfg.exclude_nodes_check_interval_sec),
                                          self.cluster_ref, PollExcludeFile()))

    async def _start_grpc(self) -> None:
        assert self.service is not None
        cfg = self.cfg
        self.servicer = CoordinatorServicer(self.service, self.metrics.counters)
        server = self._grpc = grpc.aio.server(options=GRPC_OPTIONS)
        add_coordinator_servicer(self.servicer, server)
        self.grpc_port = bind_grpc(server, what="gRPC", keys="grpc_port / grpc_bind_address",
                                   host=cfg.grpc_bind_address, port=cfg.grpc_port)
        await server.start()

    async def _stop_grpc(self) -> None:
        if self._grpc is not None:
            await self._grpc.stop(self._grace_s)
            self._grpc = None

    async def _start_http(self) -> None:
        assert self.service is not None and self.admin is not None
        cfg = self.cfg
        app = build_app(service=self.service, admin=self.admin, auth=self.admin_auth)
        runner = self._http = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        self.http_port = await start_tcp_site(runner, what="the HTTP API", keys="http_port / http_bind_address",
                                              host=cfg.http_bind_address, port=cfg.http_port)
        self.admin.identity = CoordinatorIdentity(host=cfg.grpc_bind_address, grpc_port=self.grpc_port,
                                                  http_port=self.http_port, start_time_ms=self._start_time_ms)

    async def _stop_http(self) -> None:
        if self._http is not None:
            await self._http.cleanup()
            self._http = None

    async def _start_push(self) -> None:
        cfg = self.cfg
        if not cfg.metrics.push_gateway_endpoint:
            return
        assert self.admin is not None and self.timer_ref is not None
        pusher = self.pusher = MetricsPusher(
            cfg.metrics, registry=self.metrics.registry, job=COORDINATOR_JOB,
            grouping={"instance": f"{cfg.grpc_bind_address}:{self.grpc_port}", "version": __version__},
            refresh=self.admin.refresh_metrics, clock=self.clock)
        pusher.describe()
        timer = self.timer_ref
        await self.system.start_child(None, ChildSpec(METRICS_PUSH, lambda: PeriodicJobActor(
            pusher.push_once, timer=timer, key=METRICS_PUSH, interval_s=lambda: pusher.interval_s,
            first_delay_s=0.0, what="metrics push")))

    async def _stop_push(self) -> None:
        if self.pusher is not None:  # its timer entry is cancelled by its on_stop
            await self.system.stop_child(None, METRICS_PUSH)

    # ------------------------------------------------------------- wiring
    async def _tell_server(self, view: ServerView, action: str) -> tuple[bool, str]:
        """The server's ``ShuffleServerInternal.<action>``, with this coordinator's admin credentials
        (so servers and coordinator share them, e.g. one ``RIFFLE_ADMIN_TOKEN``); only when
        ``tell_servers_on_decommission`` is on (the credentials go to the address the server advertised)."""
        if not self.cfg.tell_servers_on_decommission:
            return False, "not told: the coordinator's tell_servers_on_decommission is off"
        return await tell_server(view.node.ip, view.node.grpc_port, action, _authorization(self.admin_auth),
                                 timeout_s=TELL_SERVER_TIMEOUT_S)


def _authorization(auth: AdminCredentials) -> str | None:
    """The ``Authorization`` value these credentials present (the token first)."""
    if auth.token:
        return f"Bearer {auth.token}"
    if auth.basic_user and auth.basic_password:
        return "Basic " + base64.b64encode(f"{auth.basic_user}:{auth.basic_password}".encode()).decode()
    return None


def _schemes(auth: AdminCredentials) -> str:
    return " or ".join(s for s, on in (("Bearer token", auth.token), ("HTTP Basic", auth.basic_user)) if on)


async def serve(cfg: CoordinatorConfig, stop: asyncio.Event, ports: PortFileWriter) -> int:
    """Run the coordinator until ``stop`` is set; returns the exit code."""
    coordinator = Coordinator(cfg)
    await coordinator.start()
    try:
        ports(grpc_port=coordinator.grpc_port, http_port=coordinator.http_port)
        await stop.wait()
    finally:
        await coordinator.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``riffle-coordinator [run] --config PATH ...`` (see ``riffle_actors.daemon``)."""
    return run_daemon(
        argv,
        prog="riffle-coordinator",
        description="Uniffle-compatible shuffle coordinator (gRPC + HTTP JSON API)",
        load_config=load_coordinator_config,
        log_config=lambda cfg: cfg.log,
        serve=serve,
    )


if __name__ == "__main__":
    raise SystemExit(main())
