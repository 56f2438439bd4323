"""ShuffleServer: the composition root of ``riffle-server`` and its ``main()``.

Builds the supervisor tree from a ``ServerConfig`` and starts the transports::

    root (one_for_one)
      timer              TimerActor: ticket expiry, app expiry, disk probe rounds, heartbeats
      storage            Supervisor of one DiskActor per data path and the DiskMonitorActor (permanent)
      memory             MemoryManagerActor (permanent; budget and tickets survive its restarts)
      spill              SpillDispatcherActor (permanent)
      apps               Supervisor of one AppActor per app (temporary children)
      app_manager        AppManagerActor (permanent)
      heartbeat          HeartbeatActor, when coordinator_quorum is set

Shutdown (SIGTERM): stop taking RPCs (gRPC grace period), spill what is in memory within
``grace_period_sec``, then stop every actor; exit code 0.

Disk health: a ``DiskHealthBoard`` owned by the DiskMonitor (probes out of process, IO failures
reported by the Disk actors) decides which disks take data; the SpillDispatcher, the service's
read path and ``health()`` read it. Each disk's thread pools, ``LocalIO`` and fences live in a
``DiskResources`` that survives Disk actor restarts. Tests inject faults with
``local_io_factory(name, root) -> LocalIO`` and a ``probe_fn``; nothing in the config selects them.

See also: ``riffle_actors.service`` (what the transports call), ``riffle_actors.daemon``.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
from collections.abc import Callable

from loguru import logger

from riffle_actors import __version__
from riffle_actors.runtime import ActorSystem, ChildSpec, RestartPolicy, Supervisor
from riffle_actors.actors.app import AppActor
from riffle_actors.actors.app_manager import (
    AppDirectory,
    AppManagerActor,
    CheckExpiredApps,
    FlushAllApps,
    GetHistory,
    ListApps,
)
from riffle_actors.actors.disk import DiskActor, DiskResources, GetDiskInfo
from riffle_actors.actors.disk_monitor import DiskMonitorActor, GetProbeStats, ProbeStats, RunProbeRound
from riffle_actors.actors.memory import AttachAppManager, ExpireTickets, GetBudget, MemoryManagerActor
from riffle_actors.actors.spill import GetSpillStats, SpillDispatcherActor
from riffle_actors.runtime.timer import ScheduleEvery, TimerActor
from riffle_actors.runtime.clock import Clock, SystemClock
from riffle_actors.config import ServerConfig, load_config
from riffle_actors.io.local import LOCAL_IO, LocalIO
from riffle_actors.io.probe import ProbeFn, ProbeResult, probe_disk
from riffle_actors.io.probe_fleet import ProbeFleet
from riffle_actors.metrics import Metrics
from riffle_actors.service import ShuffleService
from riffle_actors.state.budget import MemoryBudget
from riffle_actors.state.disk_health import DiskHealthBoard, DiskStatus, HealthPolicy
from riffle_actors.state.tickets import TicketBook
from riffle_actors.transport.grpc_server import ShuffleServerServicer, start_grpc_server
from riffle_actors.transport.http_server import start_http_server
from riffle_actors.transport.urpc_server import UrpcServer


class ShuffleServer:
    def __init__(self, cfg: ServerConfig, *, clock: Clock | None = None,
                 local_io_factory: Callable[[str, str], LocalIO] | None = None, probe_fn: ProbeFn = probe_disk,
                 probe_fleet_factory: Callable[[], ProbeFleet] | None = None):
        """``local_io_factory(disk name, root)``, ``probe_fn`` (a module-level function, it runs in the
        probe worker processes) and ``probe_fleet_factory`` are seams for fault tests."""
        self.cfg = cfg
        self.clock = clock or SystemClock()
        self.metrics = Metrics()
        self.system = ActorSystem(clock=self.clock, on_escalation=self._on_escalation)
        self.directory = AppDirectory()
        self.budget = MemoryBudget(cfg.memory_store.capacity)
        self.tickets = TicketBook(self.clock, cfg.memory_store.buffer_ticket_timeout_sec)
        self.grpc_port = 0
        self.http_port = 0
        self.urpc_port = 0  # 0 = urpc off
        self._urpc: UrpcServer | None = None
        self.start_time_ms = int(time.time() * 1000)
        self.escalated: BaseException | None = None
        self._grpc = None
        self._http = None
        self._refresher: asyncio.Task | None = None
        self._stopped = False
        self.app_manager = None
        self.ip = "127.0.0.1"
        self.server_id = ""
        ls = cfg.localfile_store
        self.disk_names: list[str] = list(ls.data_paths)  # a disk's name is its data path
        self.disk_health = DiskHealthBoard(
            [(path, path) for path in ls.data_paths],
            HealthPolicy(high_watermark=ls.disk_high_watermark, low_watermark=ls.disk_low_watermark,
                         failures_to_quarantine=ls.disk_failures_to_quarantine,
                         probation_probes=ls.disk_probation_probes))
        self._local_io_factory = local_io_factory
        self._probe_fn = probe_fn
        self._probe_fleet_factory = probe_fleet_factory or ProbeFleet
        self._disk_resources: dict[str, DiskResources] = {}

    def _on_escalation(self, exc: BaseException) -> None:
        self.escalated = exc
        logger.opt(exception=exc).critical("the supervisor tree gave up; the server is UNHEALTHY")

    # ------------------------------------------------------------- start / stop
    async def start(self) -> None:
        cfg = self.cfg
        system = self.system
        self.metrics.loop_lag.start()
        await system.start()
        self.timer = await system.start_child(None, ChildSpec("timer", lambda: TimerActor(self.clock)))
        storage = await system.start_child(None, ChildSpec("storage", lambda: Supervisor(
            "storage", max_restarts=10, within_s=60.0, clock=self.clock)))
        self.storage = storage
        self.disks = []
        ls = cfg.localfile_store
        for path in ls.data_paths:
            # created once per disk: threads, IO layer and fences survive Disk actor restarts
            res = self._disk_resources[path] = DiskResources(
                path, path, local_io=self._local_io_factory(path, path) if self._local_io_factory else LOCAL_IO,
                write_threads=ls.disk_write_threads, read_threads=ls.disk_read_threads,
                io_timeout_s=ls.disk_io_timeout_sec)
            spec = ChildSpec(f"disk:{path}", lambda p=path, r=res: DiskActor(p, p, resources=r))
            self.disks.append((path, await system.start_child(storage, spec)))
        hs = cfg.hybrid_store
        holder: dict = {}
        self.memory = await system.start_child(None, ChildSpec("memory", lambda: MemoryManagerActor(
            budget=self.budget, tickets=self.tickets, high_watermark=hs.memory_spill_high_watermark,
            low_watermark=hs.memory_spill_low_watermark, clock=self.clock, app_manager=holder.get("app_manager"))))
        disk_refs = dict(self.disks)
        self.spill = await system.start_child(None, ChildSpec("spill", lambda: SpillDispatcherActor(
            disk_refs, max_concurrency=hs.memory_spill_max_concurrency, clock=self.clock,
            on_spilled=self.metrics.on_spilled, on_spill_failed=self.metrics.on_spill_failed,
            health=self.disk_health)))
        self.disk_monitor = await system.start_child(storage, ChildSpec("disk_monitor", lambda: DiskMonitorActor(
            board=self.disk_health, probe_timeout_s=ls.disk_probe_timeout_sec,
            interval_s=float(ls.disk_healthy_check_interval_sec), probe_fn=self._probe_fn, clock=self.clock,
            subscribers=[self.spill], fleet_factory=self._probe_fleet_factory)))
        for res in self._disk_resources.values():
            res.monitor = self.disk_monitor  # Disk actors report IO failures from now on
        apps_sup = await system.start_child(None, ChildSpec("apps", lambda: Supervisor(
            "apps", max_restarts=1000, within_s=1.0, clock=self.clock)))
        ac = cfg.app_config

        def app_factory(app_id: str) -> AppActor:
            return AppActor(app_id, clock=self.clock, heartbeat_timeout_s=ac.app_heartbeat_timeout_min * 60,
                            memory=self.memory, spill=self.spill,
                            single_buffer_spill_bytes=hs.memory_single_buffer_max_spill_size,
                            huge_threshold_bytes=ac.partition_limit_threshold if ac.partition_limit_enable else None,
                            huge_spill_bytes=ac.huge_partition_memory_single_buffer_max_spill_size)

        self.app_manager = await system.start_child(None, ChildSpec("app_manager", lambda: AppManagerActor(
            directory=self.directory, app_factory=app_factory, memory=self.memory,
            disks=[ref for _, ref in self.disks], clock=self.clock, apps_supervisor=apps_sup)))
        holder["app_manager"] = self.app_manager
        await self.memory.tell(AttachAppManager(self.app_manager))

        await self.timer.ask(ScheduleEvery("expire-tickets", float(cfg.memory_store.buffer_ticket_check_interval_sec),
                                           self.memory, ExpireTickets()))
        await self.timer.ask(ScheduleEvery("expire-apps", float(ac.app_expiry_check_interval_sec),
                                           self.app_manager, CheckExpiredApps()))
        await self.timer.ask(ScheduleEvery("probe-disks", float(ls.disk_healthy_check_interval_sec),
                                           self.disk_monitor, RunProbeRound()))

        huge_limit = (int(cfg.memory_store.capacity * ac.partition_limit_memory_backpressure_ratio)
                      if ac.partition_limit_enable else None)
        self.service = ShuffleService(directory=self.directory, app_manager=self.app_manager, memory=self.memory,
                                      disks=self.disks, metrics=self.metrics, huge_partition_limit_bytes=huge_limit,
                                      disk_health=self.disk_health, max_read_length=cfg.grpc_max_message_size)
        self._grpc, self.grpc_port = await start_grpc_server(ShuffleServerServicer(self.service, self.metrics),
                                                             cfg.grpc_bind_address, cfg.grpc_port,
                                                             cfg.grpc_max_message_size)
        if cfg.urpc_port is not None:
            uc = cfg.urpc_config
            self._urpc = UrpcServer(self.service, self.metrics, max_frame_bytes=cfg.grpc_max_message_size,
                                    max_connections=uc.max_connections, max_inflight_bytes=uc.max_inflight_bytes,
                                    max_requests_per_connection=uc.max_requests_per_connection,
                                    index_v2=uc.get_index_rpc_version == "V2")
            self.urpc_port = await self._urpc.start(cfg.urpc_bind_address, cfg.urpc_port)
        self._http, self.http_port = await start_http_server(self, cfg.http_bind_address, cfg.http_port)
        await self._start_heartbeat()
        logger.info("riffle-server {} listening: grpc {}:{} http {}:{}{}, memory {} bytes, data paths {}",
                    __version__, cfg.grpc_bind_address, self.grpc_port, cfg.http_bind_address, self.http_port,
                    f" urpc {cfg.urpc_bind_address}:{self.urpc_port}" if self._urpc else "",
                    cfg.memory_store.capacity, cfg.localfile_store.data_paths)

    async def _start_heartbeat(self) -> None:
        if not self.cfg.coordinator_quorum:
            logger.info("no coordinator_quorum: running standalone")
            return
        from riffle_actors.actors.heartbeat import HeartbeatActor
        from riffle_actors.netaddr import advertised_ip

        self.ip = advertised_ip(self.cfg.grpc_bind_address)
        self.server_id = f"{self.ip}-{self.grpc_port}" + (f"-{self.urpc_port}" if self.urpc_port else "")
        interval = float(self.cfg.heartbeat_interval_seconds)
        await self.refresh_snapshot()
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop(max(1.0, interval / 2)))
        self.heartbeat = await self.system.start_child(None, ChildSpec("heartbeat", lambda: HeartbeatActor(
            self.cfg.coordinator_quorum, float(self.cfg.heartbeat_interval_seconds), self.heartbeat_snapshot,
            clock=self.clock)))

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop serving, flush memory within the grace period, stop every actor. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self.metrics.loop_lag.stop()
        grace = self.cfg.grace_period_sec if grace_s is None else grace_s
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None
        if self._grpc is not None:
            await self._grpc.stop(min(grace, 5.0))
            self._grpc = None
        if self._urpc is not None:
            await self._urpc.stop(min(grace, 5.0))
            self._urpc = None
        if grace > 0 and self.budget.used and self.app_manager is not None:
            try:
                await asyncio.wait_for(self.app_manager.ask(FlushAllApps()), timeout=grace)
                logger.info("flushed memory to disk before exit")
            except (asyncio.TimeoutError, Exception) as e:  # noqa: BLE001 - shutdown goes on regardless
                logger.warning("could not flush everything within {}s: {!r}", grace, e)
        if self._http is not None:
            await self._http.cleanup()
            self._http = None
        # the app manager goes first: apps stopped by the shutdown are not purged, so what was
        # flushed stays on disk (removing it is an operator's or a later recovery's decision)
        if self.app_manager is not None:
            for ref in list(self.directory.values()):
                ref.unwatch(self.app_manager)
            await self.system.stop_child(None, "app_manager")
            self.app_manager = None
        await self.system.stop_all()
        for res in self._disk_resources.values():
            res.close()

    # ------------------------------------------------------------- reports
    async def refresh_snapshot(self) -> None:
        s = self.metrics.snapshot
        report = await self.memory.ask(GetBudget())
        s.capacity, s.allocated, s.used, s.in_flight = (report.budget.capacity, report.budget.allocated,
                                                        report.budget.used, report.budget.in_flight)
        s.tickets = report.tickets
        s.apps = len(self.directory)
        stats = await self.spill.ask(GetSpillStats())
        s.spill_pending, s.spill_running = stats.pending, stats.running
        s.disks = await self._disk_infos(stats)
        s.actors = self.system.statistics()
        s.healthy = not (await self.health())["reasons"]

    async def _disk_infos(self, stats) -> list[dict]:
        """One entry per disk: its verdict and the operator text (what failed, why, what the server did)."""
        infos = []
        for name, ref in self.disks:
            h = self.disk_health[name]
            override = stats.unhealthy_disks.get(name) if h.placeable else None  # told by an operator/test
            healthy = h.placeable and override is None
            reason = override or h.describe(self.disk_health.policy)
            moved = stats.moved_from(name)
            if not healthy and moved:
                reason += "; " + ", ".join(f"{n} pending spills moved to {to}" for to, n in moved.items())
            info = {"name": name, "healthy": healthy,
                    "status": DiskStatus.QUARANTINED.value if override else h.status.value, "reason": reason,
                    "capacity": h.capacity_bytes, "used": h.used_bytes, "written_bytes": 0, "write_failures": 0,
                    "quarantines": h.quarantines_total, "probe_failures": h.probe_failures_total,
                    "last_probe_age_s": (round(self.clock.monotonic() - h.last_probe_monotonic, 3)
                                         if h.last_probe_monotonic is not None else None),
                    "spills_moved_away": sum(moved.values())}
            try:
                # counters only; the usage (statvfs) only until the first probe reported it
                di = await ref.ask(GetDiskInfo(with_usage=not h.capacity_bytes), timeout=5)
                info["written_bytes"], info["write_failures"] = di.written_bytes, di.write_failures
                if not h.capacity_bytes:
                    info["capacity"], info["used"] = di.capacity, di.used
            except Exception as e:  # noqa: BLE001 - a dead or stuck disk is reported, not raised
                info["healthy"] = False
                info["reason"] = (info["reason"] + "; " if info["reason"] else "") + f"disk actor: {e!r}"
            infos.append(info)
        return infos

    async def health(self) -> dict:
        reasons = []
        if self.escalated is not None:
            reasons.append(f"supervisor tree gave up: {self.escalated!r}")
        stats = await self.spill.ask(GetSpillStats())
        disks = await self._disk_infos(stats)
        healthy_disks = sum(1 for d in disks if d["healthy"])
        need = self.cfg.localfile_store.min_number_of_available_disks
        if healthy_disks < need:
            reasons.append(f"{healthy_disks} healthy disks, fewer than min_number_of_available_disks={need}")
            reasons.extend(f"{d['name']}: {d['reason']}" for d in disks if not d["healthy"])
        report = await self.memory.ask(GetBudget())
        stuck = self.cfg.health.memory_stuck_above_high_watermark_sec
        since = report.above_high_watermark_since
        if since is not None and self.clock.monotonic() - since > stuck:
            reasons.append(f"memory above the spill high watermark for more than {stuck}s")
        return {"status": "UNHEALTHY" if reasons else "HEALTHY", "reasons": reasons, "disks": disks,
                "memory": {"capacity": report.budget.capacity, "used": report.budget.used,
                           "allocated": report.budget.allocated, "in_flight": report.budget.in_flight}}

    async def probe_disks(self) -> dict[str, ProbeResult | None]:
        """Run a disk probe round now (one also runs every ``disk_healthy_check_interval_sec``)."""
        return await self.disk_monitor.ask(RunProbeRound())

    async def probe_stats(self) -> ProbeStats:
        return await self.disk_monitor.ask(GetProbeStats())

    async def apps(self) -> list[dict]:
        infos = await self.app_manager.ask(ListApps())
        return [{"app_id": i.app_id, "user": i.user, "registered_epoch_ms": i.registered_epoch_ms,
                 "idle_s": round(i.idle_s, 3), "partition_count": i.partition_count,
                 "memory_bytes": i.memory_bytes, "in_flight_bytes": i.in_flight_bytes,
                 "disk_bytes": sum(sh["disk_bytes"] for sh in i.shuffles.values()),
                 "received_bytes": i.received_bytes, "shuffles": i.shuffles} for i in infos]

    async def history(self) -> list[dict]:
        return await self.app_manager.ask(GetHistory())

    def heartbeat_snapshot(self):
        """What the HeartbeatActor sends: the budget (read directly) and the last refreshed snapshot."""
        from riffle_actors.actors.heartbeat import DiskSnapshot, HeartbeatSnapshot

        b = self.budget
        snap = self.metrics.snapshot
        disks = tuple(DiskSnapshot(path=d["name"], capacity_bytes=d["capacity"], used_bytes=d["used"],
                                   status="NORMAL" if d["healthy"] else
                                   "OVERUSED" if d.get("status") == DiskStatus.OVERUSED.value else "UNHEALTHY")
                      for d in snap.disks)
        return HeartbeatSnapshot(
            ip=self.ip, grpc_port=self.grpc_port, http_port=self.http_port, netty_port=self.urpc_port,
            tags=tuple(self.cfg.tags),
            used_memory=b.used + b.allocated, pre_allocated_memory=b.allocated,
            available_memory=max(0, b.capacity - b.used - b.allocated),
            event_num_in_flush=snap.spill_pending + snap.spill_running,
            is_healthy=snap.healthy and self.escalated is None, disks=disks, start_time_ms=self.start_time_ms)

    async def _refresh_loop(self, interval_s: float) -> None:
        """Keeps the snapshot the heartbeat reads fresh (health, disks, spill queue)."""
        while True:
            try:
                await self.refresh_snapshot()
            except Exception as e:  # noqa: BLE001 - reported as unhealthy, never fatal
                self.metrics.snapshot.healthy = False
                logger.warning("could not refresh server state: {!r}", e)
            await asyncio.sleep(interval_s)


async def serve(cfg: ServerConfig, stop_event: asyncio.Event, ports) -> int:
    server = ShuffleServer(cfg)
    try:
        await server.start()
        # Everything allocated so far (modules, config, actors) lives as long as the process: keep
        # it out of the cyclic GC, whose full collections otherwise scan ~140k such objects and
        # stall the event loop ~30 ms each time. Cost: a reference cycle among these objects
        # would never be freed. (Here only, not in ShuffleServer.start: tests start many servers.)
        gc.collect()
        gc.freeze()
        ports(grpc_port=server.grpc_port, http_port=server.http_port,
              **({"urpc_port": server.urpc_port} if server.urpc_port else {}))
        await stop_event.wait()
        logger.info("stopping: flushing memory within {}s", cfg.grace_period_sec)
    finally:
        await server.stop()
    logger.info("riffle-server stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    from riffle_actors.daemon import run_daemon

    return run_daemon(argv, prog="riffle-server", load_config=load_config, log_config=lambda cfg: cfg.log,
                      serve=serve, description="Uniffle-compatible shuffle server (riffle_actors)")


if __name__ == "__main__":
    sys.exit(main())
