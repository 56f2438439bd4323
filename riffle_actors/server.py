"""ShuffleServer: the composition root of ``riffle-server`` and its ``main()``.

Wiring and start/stop only: it builds the supervisor tree from a ``ServerConfig``, the two
services (``ShuffleService``: the data plane; ``AdminService``: health, reports, snapshots) and
the transports that call them (gRPC, HTTP, the coordinator client of the heartbeat)::

    root (one_for_one)
      timer              TimerActor: ticket expiry, app expiry, disk probe rounds (entries survive restarts)
      storage            Supervisor of one DiskActor per data path and the DiskMonitorActor (permanent)
      memory             MemoryManagerActor (permanent; budget and tickets survive its restarts)
      spill              SpillDispatcherActor (permanent; queue and running batches survive its restarts)
      apps               Supervisor of one AppActor per app (temporary children, which outlive its crash)
      app_manager        AppManagerActor (permanent; directory and unfinished purges survive its restarts)
      heartbeat          HeartbeatActor, when coordinator_quorum is set

Operator actions (``riffle_actors.decommission.Lifecycle``, reached through the HTTP ``/admin``
routes and the ``ShuffleServerInternal`` gRPC service, both guarded by ``[admin]``): kill runs the
same graceful stop as SIGTERM; decommission reports DECOMMISSIONING and stops once no app is left.

Shutdown (SIGTERM): tell every coordinator that this server is stopping (a DECOMMISSIONED
heartbeat, so it gets no new apps), stop taking RPCs (gRPC grace period), spill what is in memory
within ``grace_period_sec``, then stop every actor; exit code 0.

Disk health: a ``DiskHealthBoard`` owned by the DiskMonitor (probes out of process, IO failures
reported by the Disk actors) decides which disks take data; the SpillDispatcher, the service's
read path and ``AdminService.health()`` read it. Each disk's thread pools, ``LocalIO`` and fences live in a
``DiskResources`` that survives Disk actor restarts. Tests inject faults with
``local_io_factory(name, root) -> LocalIO`` and a ``probe_fn``; nothing in the config selects them.

See also: ``riffle_actors.service`` and ``riffle_actors.admin`` (what the transports call),
``riffle_actors.daemon``.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import ipaddress
import os
import shutil
import socket
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from loguru import logger

from riffle_actors import __version__
from riffle_actors.actors.app import AppActor
from riffle_actors.actors.app_manager import (
    AppDirectory,
    AppManagerActor,
    AppManagerLedger,
    CheckExpiredApps,
    FlushAllApps,
)
from riffle_actors.actors.disk import DiskActor, DiskReadAhead, DiskResources, DiskThrottle, RetryFailedPurges
from riffle_actors.actors.disk_monitor import DiskMonitorActor
from riffle_actors.actors.hdfs_writer import (
    AllowedRemoteStorages,
    HdfsResources,
    HdfsSpillRoute,
    HdfsWriterActor,
)
from riffle_actors.actors.heartbeat import (
    AnnounceStopping,
    HeartbeatActor,
    HeartbeatSnapshot,
    SendHeartbeatNow,
)
from riffle_actors.actors.memory import ExpireTickets, MemoryManagerActor, SetWatermarks
from riffle_actors.actors.meta_log import ShuffleMetaLog
from riffle_actors.actors.scrub import ScrubSettings
from riffle_actors.actors.spill import SpillBacklog, SpillDispatcherActor
from riffle_actors.actors.storage_messages import RunProbeRound
from riffle_actors.admin import AdminService, HealthRules, ServerIdentity
from riffle_actors.config import (
    ConfigError,
    GrpcEngine,
    ServerConfig,
    apply_riffle_keys,
    load_config,
    riffle_key_notes,
)
from riffle_actors.credentials import AdminCredentialError, AdminCredentials
from riffle_actors.decommission import Lifecycle
from riffle_actors.host import HostLaunch, serve_host
from riffle_actors.io.app_history import AppHistory, open_app_history
from riffle_actors.io.data_lock import DataPathLocks, lock_data_paths
from riffle_actors.io.hdfs import HdfsIO, KerberosLogin, precheck
from riffle_actors.io.local import LocalIO, RealLocalIO
from riffle_actors.io.malloc import tune_malloc
from riffle_actors.io.probe import ProbeFn, probe_disk
from riffle_actors.io.probe_fleet import ProbeFleet
from riffle_actors.log import set_level as set_log_level
from riffle_actors.metrics import Metrics
from riffle_actors.metrics_push import SERVER_JOB, MetricsPusher
from riffle_actors.netaddr import advertised_ip
from riffle_actors.reconf import RELOADABLE, ConfigReloader
from riffle_actors.recovery import RecoveryReport, recover
from riffle_actors.runtime import (
    ActorDeadError,
    ActorRef,
    ActorSystem,
    ChildSpec,
    ChildTable,
    Clock,
    MailboxFullError,
    PeriodicJobActor,
    ScheduleEvery,
    StartSequence,
    Step,
    Supervisor,
    SystemClock,
    TimerActor,
    TimerTable,
)
from riffle_actors.service import ShuffleService
from riffle_actors.state.app_state import AppLimits
from riffle_actors.state.budget import MemoryBudget
from riffle_actors.state.disk_health import DiskHealthBoard, HealthPolicy
from riffle_actors.state.integrity import IntegrityLedger
from riffle_actors.state.partition import SpillLimits
from riffle_actors.state.service_health import DiskUsage, ServiceHealthChecks
from riffle_actors.state.tickets import TicketBook
from riffle_actors.state.tier_policy import HdfsHealth, TierRules
from riffle_actors.tracing import Tracer, exporter_url
from riffle_actors.transport.coordinator_client import GrpcCoordinatorLink
from riffle_actors.transport.grpc_loop import LoopGrpcServer
from riffle_actors.transport.grpc_server import ShuffleServerServicer, start_grpc_server
from riffle_actors.transport.http_server import start_http_server
from riffle_actors.transport.listen import ListenError
from riffle_actors.transport.reply_budget import ReplyBudget
from riffle_actors.transport.server_internal import ShuffleServerInternalServicer
from riffle_actors.transport.urpc_server import UrpcServer
from riffle_actors.workers import (
    ENV_WORKER_INDEX,
    ENV_WORKER_NUMBER,
    WorkerLayoutError,
    check_layout,
    worker_config,
)

if TYPE_CHECKING:
    import grpc
    from aiohttp import web

#: How long a graceful stop waits for the coordinators to take the "stopping" heartbeat.
ANNOUNCE_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class LaunchEnv:
    """Riffle's launch environment (riffle-server's util.rs and rpc.rs upstream), checked at start.

    ``WORKER_IP``: the address advertised to coordinators and clients (and in the server id), with
    or without a coordinator quorum. ``GRPC_PARALLELISM`` / ``URPC_PARALLELISM``: Riffle's number of
    gRPC / urpc server threads; here both servers run on the one event loop of the process, so
    they are checked (a positive integer, as Riffle requires) and logged as having no effect.
    """

    worker_ip: str | None = None
    grpc_parallelism: int | None = None
    urpc_parallelism: int | None = None

    @classmethod
    def read(cls, environ: os._Environ[str] | dict[str, str] = os.environ) -> LaunchEnv:
        """Raises ``ValueError`` with ``(variable, reason)`` pairs in ``args[0]`` for unusable values."""
        problems: list[tuple[str, str]] = []
        ip = environ.get("WORKER_IP", "").strip() or None
        if ip is not None:
            try:
                ip = str(ipaddress.ip_address(ip))
            except ValueError:
                problems.append(("WORKER_IP (environment)", f"{ip!r} is not an IP address"))
        counts: dict[str, int | None] = {}
        for name in ("GRPC_PARALLELISM", "URPC_PARALLELISM"):
            raw = environ.get(name, "").strip()
            counts[name] = None
            if raw:
                if raw.isdigit() and int(raw) > 0:
                    counts[name] = int(raw)
                else:
                    problems.append((f"{name} (environment)", f"{raw!r} is not a positive integer"))
        if problems:
            raise ValueError(problems)
        return cls(worker_ip=ip, grpc_parallelism=counts["GRPC_PARALLELISM"],
                   urpc_parallelism=counts["URPC_PARALLELISM"])

    def notes(self) -> list[str]:
        return [f"{name}={value}: no effect here (Riffle's {what} server threads; the {what} server runs on "
                f"the process's event loop)"
                for name, value, what in (("GRPC_PARALLELISM", self.grpc_parallelism, "gRPC"),
                                          ("URPC_PARALLELISM", self.urpc_parallelism, "urpc"))
                if value is not None]


@dataclass(frozen=True, slots=True)
class _RiffleHealthRules(HealthRules):
    """``HealthRules`` plus Riffle's ``[health_service_config]`` checks (``ServiceHealthChecks``)."""

    checks: ServiceHealthChecks | None = None
    app_count: Callable[[], int] | None = None
    memory_used: Callable[[], int] | None = None

    def reasons(self, *, escalated: BaseException | None, disks: Sequence, above_high_watermark_since: float | None,
                now: float, stuck_spills: Sequence = ()) -> tuple[str, ...]:
        base = HealthRules.reasons(self, escalated=escalated, disks=disks,
                                   above_high_watermark_since=above_high_watermark_since, now=now,
                                   stuck_spills=stuck_spills)
        if self.checks is None or self.app_count is None or self.memory_used is None:
            return base
        extra = self.checks.reasons(apps=self.app_count(), memory_used=self.memory_used(), rss=_rss_bytes(),
                                    disks=[DiskUsage(d.name, d.capacity, d.used) for d in disks], now=now)
        return base + tuple(extra)


def _rss_bytes() -> int | None:
    """Resident memory of this process (``/proc/self/statm``), or None where there is no /proc."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _count_index_inconsistency(metrics: Metrics, disk: str, _problem: object) -> None:
    metrics.index_inconsistencies.labels(disk).inc()


def _port_or_free_one(address: str, port: int | None, key: str) -> int | None:
    """``fallback_random_ports_enable``: ``port``, or 0 (any free port) when it is already in use."""
    if not port:
        return port
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            logger.warning("{} {} is in use: taking a free port instead (fallback_random_ports_enable)", key, port)
            return 0
    return port


def _purge_data_paths(paths: Sequence[str]) -> int:
    """``launch_purge_enable``: delete everything under each data path (symlinks are removed, not
    followed); returns the entries removed. A failure stops the start, as in Riffle."""
    removed = 0
    for root in paths:
        if not os.path.isdir(root):
            continue
        for entry in os.scandir(root):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed += 1
    return removed


#: The registered names of the root's children that other actors look up by name (a name survives
#: restarts): the MemoryManager sends its spill rounds to the AppManager, the Disk actors report IO
#: failures to the DiskMonitor; both start after the actor that refers to them.
APP_MANAGER = "app_manager"
DISK_MONITOR = "disk_monitor"
#: the periodic jobs that are not an actor's own (``PeriodicJobActor``s, children of the root)
METRICS_PUSH = "metrics-push"
CONF_RELOAD = "conf-reload"


async def _nothing() -> None:
    """The start of a step that only has something to stop (its place in the order is what matters)."""


class ShuffleServer:
    """The server's parts, built by the constructor; ``start`` runs them up in one ``StartSequence``
    (each step undoes its own part of a failed start; a failed step stops the earlier ones in reverse)
    and ``stop`` takes them down in the reverse order. The steps, in start order:

    ``data-path locks`` (one server per data path, before anything reads them), ``launch checks``
    (Riffle's notes, the HDFS precheck, ``launch_purge_enable``), ``tracer`` (stopped after the
    actors: the spills of the last flush are traced), ``loop-lag monitor``, ``app history``,
    ``actors`` (the supervisor tree), ``recovery`` (before any port listens), ``periodic jobs`` (on the
    timer), ``http``, ``memory flush`` (its stop: spill what memory holds within the grace period,
    once no RPC comes in), ``grpc``, ``urpc``, ``identity`` (server id, from the bound ports),
    ``heartbeat`` (its stop announces the stop to the coordinators first), ``metrics push``,
    ``config reload``, ``decommission``.
    """

    def __init__(self, cfg: ServerConfig, *, clock: Clock | None = None,
                 local_io_factory: Callable[[str, str], LocalIO] | None = None, probe_fn: ProbeFn = probe_disk,
                 probe_fleet_factory: Callable[[], ProbeFleet] | None = None, hdfs_io: HdfsIO | None = None,
                 worker_ip: str | None = None, config_path: str | None = None,
                 load_config_fn: Callable[[str], ServerConfig] = load_config, serve_grpc: bool = True):
        """``local_io_factory(disk name, root)``, ``probe_fn`` (a module-level function, it runs in the
        probe worker processes) and ``probe_fleet_factory`` are seams for fault tests. ``serve_grpc=False``
        (the deterministic simulation, ``tests/sim``) opens no gRPC port: the caller drives
        ``grpc_servicer`` in-process, through the same handlers and (de)serializers. ``worker_ip``:
        the advertised address (``WORKER_IP``), also without a coordinator quorum. ``config_path``: the
        file ``cfg`` came from, re-read under ``conf_reload_enable`` (with ``load_config_fn``)."""
        self.riffle_notes = riffle_key_notes(cfg, applied=apply_riffle_keys(cfg))
        cfg = apply_riffle_keys(cfg)  # Riffle's names and thread pools onto our settings
        self.cfg = cfg
        self.worker_ip = worker_ip
        self.config_path = config_path
        self._load_config_fn = load_config_fn
        hc_cfg = cfg.health_service_config
        self.service_health = ServiceHealthChecks(
            alive_app_number_max_limit=hc_cfg.alive_app_number_max_limit,
            disk_used_ratio_health_threshold=hc_cfg.disk_used_ratio_health_threshold,
            memory_allocated_threshold=hc_cfg.memory_allocated_threshold,
            hang_unchanged_s=hc_cfg.service_hang_of_mem_continuous_unchange_sec,
            hang_min_apps=hc_cfg.service_hang_of_app_valid_number)
        self.clock: Clock = clock or SystemClock()
        self.metrics = Metrics()
        self.system = ActorSystem(clock=self.clock, on_escalation=self._on_escalation)
        self.directory = AppDirectory()
        self.metrics.loop_lag.busy = lambda: bool(self.directory)  # fine-grained only while apps are held
        self.budget = MemoryBudget(cfg.memory_store.capacity)
        self.tickets = TicketBook(self.clock, cfg.memory_store.buffer_ticket_timeout_sec)
        self.start_time_ms = int(self.clock.time() * 1000)
        self.escalated: BaseException | None = None
        self._serve_grpc = serve_grpc
        self.grpc_servicer: ShuffleServerServicer | None = None
        ls, ac, hs = cfg.localfile_store, cfg.app_config, cfg.hybrid_store
        self.disk_names: list[str] = list(ls.data_paths)  # a disk's name is its data path
        self.disk_health = DiskHealthBoard(
            [(path, path) for path in ls.data_paths],
            HealthPolicy(high_watermark=ls.disk_high_watermark, low_watermark=ls.disk_low_watermark,
                         failures_to_quarantine=ls.disk_failures_to_quarantine,
                         probation_probes=ls.disk_probation_probes))
        self._local_io_factory = local_io_factory
        self._probe_fn = probe_fn
        self._probe_fleet_factory = probe_fleet_factory or ProbeFleet
        # corrupt blocks per partition, per-app integrity counts (written on the loop by the service and
        # the disks' scrubbers; read by /apps)
        self.integrity = IntegrityLedger()
        # created once per disk: threads (started on first use), IO layer, throttle and fences survive
        # Disk actor restarts
        self._disk_resources: dict[str, DiskResources] = self._build_disk_resources()
        hc = cfg.hdfs_store
        # the HDFS tier (store_type with HDFS); ``hdfs_io`` is the seam for fault tests
        self.hdfs_resources: HdfsResources | None = HdfsResources(
            io=hdfs_io or HdfsIO(replication=hc.replication, kerberos=kerberos_login(cfg)),
            max_concurrency=hc.max_concurrency,
            partition_write_max_concurrency=hc.partition_write_max_concurrency,
            write_timeout_s=hc.write_timeout_sec, health=HdfsHealth(hc.unhealthy_retry_interval_sec),
            # the only bases this server writes to or connects to (the clients' paths are checked against it)
            allowed=AllowedRemoteStorages((b.path, b.conf) for b in hc.remote_storage),
            on_lost=self.metrics.hdfs_lost_bytes.inc,
        ) if cfg.store_type.has_hdfs else None
        self.app_limits = AppLimits(max_shuffles=ac.shuffle_number_max_limit,
                                    max_partitions=ac.partition_number_max_limit,
                                    report_max_ids=ac.report_block_id_number_max_limit,
                                    report_max_partition_ids=ac.report_partition_block_id_number_max_limit)
        # one instance for every app: a config reload changes its thresholds in place (riffle_actors.reconf)
        self.spill_limits = SpillLimits(
            single_buffer_bytes=hs.memory_single_buffer_max_spill_size,
            huge_threshold_bytes=ac.partition_limit_threshold if ac.partition_limit_enable else None,
            huge_spill_bytes=ac.huge_partition_memory_single_buffer_max_spill_size,
            split_threshold_bytes=ac.partition_split_threshold if ac.partition_split_enable else None)
        self.replies = ReplyBudget(cfg.max_reply_bytes, cfg.reply_wait_timeout_sec,
                                   on_change=self.metrics.held_reply_bytes.set)
        self.credentials = AdminCredentials.resolve(cfg.admin)
        #: how an operator's kill (or a finished decommission) stops this server: ``serve`` sets its
        #: stop event (the SIGTERM path); in process, ``stop()`` runs in the background
        self.request_stop: Callable[[], None] = self._stop_in_background
        self.lifecycle = Lifecycle(apps=self.directory, system=self.system,
                                   check_interval_s=cfg.decommission_check_interval_sec,
                                   request_stop=lambda: self.request_stop(), announce=self._heartbeat_now,
                                   tags=tuple(cfg.tags), start_unhealthy=cfg.initial_unhealthy_status_enable)
        # what ``start`` brings up (None / 0 until its step ran)
        self._locks: DataPathLocks | None = None
        self.app_history: AppHistory | None = None
        self.timer: ActorRef | None = None
        self.storage: ActorRef | None = None
        self.disks: list[tuple[str, ActorRef]] = []
        self.memory: ActorRef | None = None
        self.hdfs: ActorRef | None = None
        self.hdfs_route: HdfsSpillRoute | None = None
        self.spill: ActorRef | None = None
        self.disk_monitor: ActorRef | None = None
        self.meta_log: ShuffleMetaLog | None = None
        self.app_manager: ActorRef | None = None
        self.recovery: RecoveryReport | None = None
        self.service: ShuffleService | None = None
        self.admin: AdminService | None = None
        self._grpc: grpc.aio.Server | LoopGrpcServer | None = None
        self._urpc: UrpcServer | None = None
        self._http: web.AppRunner | None = None
        self.grpc_port = 0
        self.http_port = 0
        self.urpc_port = 0  # 0 = urpc off
        self.ip = "127.0.0.1"
        self.server_id = ""
        self.heartbeat: ActorRef | None = None
        self.reloader: ConfigReloader | None = None
        self._stop_task: asyncio.Task | None = None
        self._grace: float = cfg.grace_period_sec
        self._sequence = StartSequence([
            Step("data-path locks", self._lock_data_paths, self._release_data_paths),
            Step("launch checks", self._launch_checks),
            Step("tracer", _nothing, self._stop_tracer),
            Step("loop-lag monitor", self._start_loop_lag, self._stop_loop_lag),
            Step("app history", self._open_app_history, self._close_app_history),
            Step("actors", self._start_actors, self._stop_actors),
            Step("recovery", self._recover),
            Step("periodic jobs", self._schedule_periodic_jobs),  # the timer's entries go with the actors
            Step("http", self._start_http, self._stop_http),
            Step("memory flush", _nothing, self._flush_memory),
            Step("grpc", self._start_grpc, self._stop_grpc),
            Step("urpc", self._start_urpc, self._stop_urpc),
            Step("identity", self._set_identity),
            Step("heartbeat", self._start_heartbeat, self._announce_stop),
            Step("metrics push", self._start_metrics_push, self._stop_metrics_push),
            Step("config reload", self._start_reload, self._stop_reload),
            Step("decommission", _nothing, self._close_lifecycle),
        ], what="riffle-server", expected_errors=(ListenError,))

    def _build_disk_resources(self) -> dict[str, DiskResources]:
        cfg = self.cfg
        ls = cfg.localfile_store
        real_io = RealLocalIO(direct_io=ls.direct_io_append_enable, meta_max_bytes=ls.recovery_file_max_size,
                              direct_read=ls.direct_io_read_enable)
        ra_cfg = ls.read_ahead_options
        limiter = ls.io_limiter
        resources: dict[str, DiskResources] = {}
        for path in ls.data_paths:
            throttle = None
            if limiter is not None and (limiter.read_enable or limiter.write_enable):
                throttle = DiskThrottle(limiter.capacity, read=limiter.read_enable, write=limiter.write_enable,
                                        on_charged=partial(self.metrics.on_disk_throttle, path))
                for op, on in (("read", limiter.read_enable), ("write", limiter.write_enable)):
                    if on:  # the series exist (at 0) from the start
                        self.metrics.disk_throttled_seconds.labels(path, op)
                        self.metrics.disk_throttle_bytes.labels(path, op)
            read_ahead = None
            if ra_cfg is not None:
                read_ahead = DiskReadAhead(path, batch_size=ra_cfg.batch_size, batch_number=ra_cfg.batch_number,
                                           read_plan_enable=ra_cfg.read_plan_enable,
                                           read_plan_concurrency=ra_cfg.read_plan_concurrency,
                                           threads=ls.disk_read_ahead_threads,
                                           on_advised=partial(self.metrics.on_read_ahead, path))
            if ls.index_consistency_detection_enable:
                self.metrics.index_inconsistencies.labels(path)  # the series exists (at 0) from the start
            resources[path] = DiskResources(
                path, path, local_io=self._local_io_factory(path, path) if self._local_io_factory else real_io,
                write_threads=ls.disk_write_threads, read_threads=ls.disk_read_threads,
                io_timeout_s=ls.disk_io_timeout_sec, throttle=throttle, integrity=self.integrity,
                monitor_name=DISK_MONITOR,  # Disk actors report IO failures to it
                scrub=ScrubSettings(ls.scrub_rate, ls.scrub_interval_sec) if ls.scrub_rate > 0 else None,
                on_scrub_checked=self.metrics.on_scrub_checked, on_scrub_pass=self.metrics.on_scrub_pass,
                index_check=ls.index_consistency_detection_enable,
                read_crc_check=ls.read_crc_check_enable, on_read_checked=self.metrics.on_read_checked,
                on_index_inconsistent=partial(_count_index_inconsistency, self.metrics, path),
                read_ahead=read_ahead)
            for name in ("scrub_bytes", "scrub_blocks", "scrub_corrupt_blocks", "scrub_passes", "read_crc_corrupt_blocks"):
                getattr(self.metrics, name).labels(path)  # the series exist (at 0) from the start
        return resources

    async def _precheck_hdfs(self) -> None:
        """``hdfs_store.precheck_enable``: every allowed remote storage base answers, or the start fails
        (``HdfsPrecheckError``, naming the base and why), before anything else starts."""
        res = self.hdfs_resources
        if res is None:
            logger.info("hdfs_store.precheck_enable: store_type {} has no HDFS tier; nothing to check",
                        self.cfg.store_type.value)
            return
        allowed = res.allowed
        if not len(allowed):
            logger.warning("hdfs_store.precheck_enable: no [[hdfs_store.remote_storage]] base to check (apps cannot "
                           "use HDFS on this server)")
            return
        bases = [(r.path, r.fs_url, r.base, r.conf) for r in map(allowed.resolve, allowed.paths)]
        reached = await asyncio.get_running_loop().run_in_executor(
            None, precheck, res.io, bases, self.cfg.hdfs_store.write_timeout_sec)
        logger.info("hdfs_store.precheck_enable: reached {}", ", ".join(reached))

    def _stop_in_background(self) -> None:
        if self._stop_task is None:
            self._stop_task = asyncio.get_running_loop().create_task(self.stop(), name="server-stop")

    def _on_escalation(self, exc: BaseException) -> None:
        self.escalated = exc
        logger.opt(exception=exc).critical("the supervisor tree gave up; the server is UNHEALTHY")

    # ------------------------------------------------------------- start / stop
    @property
    def running_steps(self) -> tuple[str, ...]:
        """The steps of the start that are up (``StartSequence.running``)."""
        return self._sequence.running

    async def start(self) -> None:
        """Bring every part up in order; a failure stops what had started (in reverse) and is raised."""
        await self._sequence.start()
        cfg = self.cfg
        logger.info("riffle-server {} listening: grpc {}:{} http {}:{}{}, memory {} bytes, data paths {}",
                    __version__, cfg.grpc_bind_address, self.grpc_port, cfg.http_bind_address, self.http_port,
                    f" urpc {cfg.urpc_bind_address}:{self.urpc_port}" if self._urpc else "",
                    cfg.memory_store.capacity, cfg.localfile_store.data_paths)

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop serving, flush memory within the grace period, stop every actor (every started step, in
        reverse order). Idempotent; also takes down a start in progress."""
        if grace_s is not None and self._sequence.phase in ("new", "starting", "running"):
            self._grace = grace_s
        await self._sequence.stop()

    async def _lock_data_paths(self) -> None:
        # first of all, before recovery reads or repairs anything: one server per data path
        # (DataPathLockedError names the path and the holder's pid)
        self._locks = lock_data_paths(self.cfg.localfile_store.data_paths)

    async def _release_data_paths(self) -> None:
        if self._locks is not None:  # last: nothing of this server touches the data paths any more
            self._locks.release()
            self._locks = None

    async def _launch_checks(self) -> None:
        cfg = self.cfg
        for level, note in self.riffle_notes:  # once per start: what each Riffle-only key does here
            logger.log(level, note)
        ls = cfg.localfile_store
        if ls.direct_io_read_enable and not ls.direct_io_append_enable:
            logger.warning("direct_io_read_enable: reads stay buffered because appends are buffered "
                           "(direct_io_append_enable = false); Riffle reads directly only where it appends directly")
        ra_cfg = ls.read_ahead_options
        if ra_cfg is not None:
            logger.info("read-ahead on every disk for apps that ask for it (spark.rss.riffle.readAheadEnabled): "
                        "batches of {} bytes, {} at first, {} thread(s) per disk{}", ra_cfg.batch_size,
                        ra_cfg.batch_number, ls.disk_read_ahead_threads,
                        f", read plans (at most {ra_cfg.read_plan_concurrency} per disk)"
                        if ra_cfg.read_plan_enable else "")
        limiter = ls.io_limiter
        if limiter is not None and (limiter.read_enable or limiter.write_enable):
            one_buffer = cfg.hybrid_store.memory_single_buffer_max_spill_size
            for path in ls.data_paths:
                logger.info("disk {}: throughput limited to {} bytes/s (io_limiter; reads {}, writes {})", path,
                            limiter.capacity, "limited" if limiter.read_enable else "not limited",
                            "limited" if limiter.write_enable else "not limited")
                if limiter.write_enable and one_buffer and one_buffer > limiter.capacity * ls.disk_io_timeout_sec:
                    logger.warning("disk {}: a spill batch of memory_single_buffer_max_spill_size ({} bytes) waits "
                                   "longer than disk_io_timeout_sec ({}s) for io_limiter.capacity ({} bytes/s) and "
                                   "would time out", path, one_buffer, ls.disk_io_timeout_sec, limiter.capacity)
        if cfg.initial_unhealthy_status_enable:
            logger.warning("initial_unhealthy_status_enable: the server reports UNHEALTHY (assigned nothing) until "
                           "an operator sets it healthy (riffle-ctl instance set --status healthy)")
        if cfg.hdfs_store.precheck_enable:
            await self._precheck_hdfs()
        if ls.launch_purge_enable:
            removed = await asyncio.get_running_loop().run_in_executor(
                None, _purge_data_paths, list(ls.data_paths))
            logger.info("launch_purge_enable: removed {} entries under the data paths", removed)

    async def _start_loop_lag(self) -> None:
        self.metrics.loop_lag.start()

    async def _stop_loop_lag(self) -> None:
        self.metrics.loop_lag.stop()

    async def _open_app_history(self) -> None:
        hc = self.cfg.historical_apps_config
        # the finished apps behind /apps/history; the SLED backend's file is loaded off the loop
        self.app_history = await asyncio.get_running_loop().run_in_executor(None, partial(
            open_app_history, backend=hc.backend if hc else None, retention_days=hc.retention_days if hc else None,
            db_path=hc.db_path if hc else None, max_apps=hc.max_apps if hc else 1000,
            now_ms=lambda: int(self.clock.time() * 1000)))

    async def _close_app_history(self) -> None:
        if self.app_history is not None:  # writes what is queued (the purges of this stop included)
            await asyncio.get_running_loop().run_in_executor(None, self.app_history.close)

    async def _start_actors(self) -> None:
        try:
            await self._start_supervisor_tree()
        except BaseException:
            await self._stop_actors()  # what of the tree had started
            raise

    async def _start_supervisor_tree(self) -> None:
        cfg, system, clock = self.cfg, self.system, self.clock
        ls, hs, ac = cfg.localfile_store, cfg.hybrid_store, cfg.app_config
        await system.start()
        # every permanent actor gets the state that must outlive its crashes from here (see each one)
        timer_table = TimerTable()
        self.timer = await system.start_child(None, ChildSpec("timer", lambda: TimerActor(clock, timer_table)))
        storage_table = ChildTable()  # the Disk actors and the DiskMonitor outlive a crash of their supervisor
        storage = self.storage = await system.start_child(None, ChildSpec("storage", lambda: Supervisor(
            "storage", max_restarts=10, within_s=60.0, clock=clock, table=storage_table)))
        for path, res in self._disk_resources.items():
            spec = ChildSpec(f"disk:{path}", partial(DiskActor, path, path, resources=res))
            self.disks.append((path, await system.start_child(storage, spec)))
        # a restarted MemoryManager takes the watermarks in force (a config reload may have changed them);
        # it finds the AppManager (started below) by its name when memory has to be spilled
        memory = self.memory = await system.start_child(None, ChildSpec("memory", lambda: MemoryManagerActor(
            budget=self.budget, tickets=self.tickets, high_watermark=self.cfg.hybrid_store.memory_spill_high_watermark,
            low_watermark=self.cfg.hybrid_store.memory_spill_low_watermark, clock=clock,
            app_manager_name=APP_MANAGER,
            app_max_ticket_bytes=int(cfg.memory_store.capacity * cfg.memory_store.app_buffer_ticket_max_ratio),
            app_max_tickets=cfg.memory_store.app_buffer_ticket_max_number,
            sensitive_watermark=self.cfg.hybrid_store.sensitive_watermark_spill_enable)))
        disk_refs = dict(self.disks)
        hdfs: ActorRef | None = None
        if self.hdfs_resources is not None:
            hres = self.hdfs_resources
            self.hdfs = hdfs = await system.start_child(storage, ChildSpec("hdfs", lambda: HdfsWriterActor(hres)))
            self.hdfs_route = HdfsSpillRoute(hdfs, hres, TierRules(
                hdfs_enabled=True, local_enabled=cfg.store_type.has_localfile,
                cold_threshold_bytes=hs.memory_spill_to_cold_threshold_size,
                huge_to_hdfs_bytes=hs.huge_partition_memory_spill_to_hdfs_threshold_size,
                retry_after_s=cfg.hdfs_store.unhealthy_retry_interval_sec), clock=clock,
                on_choice=self.metrics.on_tier_choice, on_spilled=self.metrics.on_spilled)
        backlog = SpillBacklog(disk_refs, max_concurrency=hs.memory_spill_max_concurrency)
        spill = self.spill = await system.start_child(None, ChildSpec("spill", lambda: SpillDispatcherActor(
            disk_refs, clock=clock, on_spilled=self.metrics.on_spilled,
            on_spill_failed=self.metrics.on_spill_failed, health=self.disk_health, backlog=backlog,
            hdfs=self.hdfs_route)))
        self.disk_monitor = await system.start_child(storage, ChildSpec(DISK_MONITOR, lambda: DiskMonitorActor(
            board=self.disk_health, probe_timeout_s=ls.disk_probe_timeout_sec,
            interval_s=float(ls.disk_healthy_check_interval_sec), probe_fn=self._probe_fn, clock=clock,
            subscribers=[spill], fleet_factory=self._probe_fleet_factory)))
        # the durable shuffle metadata (registrations, reported ids, segments) of every app
        meta_log = self.meta_log = ShuffleMetaLog(self.disks, self.disk_health, clock=clock,
                                                  retry_timeout_s=ls.meta_write_retry_timeout_sec)
        apps_table = ChildTable()  # the AppActors outlive a crash of their supervisor
        apps_sup = await system.start_child(None, ChildSpec("apps", lambda: Supervisor(
            "apps", max_restarts=1000, within_s=1.0, clock=clock, table=apps_table)))
        app_limits, spill_limits = self.app_limits, self.spill_limits

        def app_factory(app_id: str) -> AppActor:
            return AppActor(app_id, clock=clock, heartbeat_timeout_s=ac.app_heartbeat_timeout_min * 60,
                            memory=memory, spill=spill, single_buffer_spill_bytes=None,
                            meta=meta_log, limits=app_limits, spill_limits=spill_limits)

        ledger = AppManagerLedger(history=self.app_history)
        self.app_manager = await system.start_child(None, ChildSpec(APP_MANAGER, lambda: AppManagerActor(
            directory=self.directory, app_factory=app_factory, memory=memory,
            # the HDFS writer takes the disks' PurgeFiles / UnfenceApp too: purges delete the app's HDFS files
            disks=[ref for _, ref in self.disks] + ([hdfs] if hdfs is not None else []),
            clock=clock, apps_supervisor=apps_sup, ledger=ledger, max_apps=ac.app_number_hard_limit)))

    async def _stop_actors(self) -> None:
        # the app manager goes first: apps stopped by the shutdown are not purged, so what was
        # flushed stays on disk (removing it is an operator's or a later recovery's decision)
        if self.app_manager is not None:
            for ref in list(self.directory.values()):
                ref.unwatch(self.app_manager)
            await self.system.stop_child(None, APP_MANAGER)
            self.app_manager = None
        await self.system.stop_all()
        for res in self._disk_resources.values():
            res.close()
        if self.hdfs_resources is not None:
            self.hdfs_resources.close()

    async def _recover(self) -> None:
        # before any port listens: what the data paths hold is served from the first request on
        assert self.app_manager is not None
        rec = self.recovery = await recover(list(self._disk_resources.values()), self.app_manager, self.hdfs,
                                            max_file_bytes=self.cfg.localfile_store.recovery_file_max_size)
        self.metrics.on_recovered(seconds=rec.seconds, apps=rec.apps, partitions=rec.partitions,
                                  lost_blocks=rec.lost_blocks, removed=len(rec.removed),
                                  remote_storage_refused=len(rec.remote_storage_refused), foreign=rec.foreign)

    async def _schedule_periodic_jobs(self) -> None:
        cfg, timer = self.cfg, self.timer
        ac, ls = cfg.app_config, cfg.localfile_store
        assert timer is not None and self.memory is not None and self.app_manager is not None
        assert self.disk_monitor is not None
        await timer.ask(ScheduleEvery("expire-tickets", float(cfg.memory_store.buffer_ticket_check_interval_sec),
                                      self.memory, ExpireTickets()))
        await timer.ask(ScheduleEvery("expire-apps", float(ac.app_expiry_check_interval_sec),
                                      self.app_manager, CheckExpiredApps()))
        await timer.ask(ScheduleEvery("probe-disks", float(ls.disk_healthy_check_interval_sec),
                                      self.disk_monitor, RunProbeRound()))
        for path, disk in self.disks:  # a purge that failed on a disk is tried again until it succeeds
            await timer.ask(ScheduleEvery(f"retry-purges:{path}", float(ac.app_expiry_check_interval_sec),
                                          disk, RetryFailedPurges()))

    def _build_service_and_admin(self) -> None:
        cfg, ls, ac = self.cfg, self.cfg.localfile_store, self.cfg.app_config
        assert self.app_manager is not None and self.memory is not None and self.spill is not None
        assert self.disk_monitor is not None
        huge_limit = (int(cfg.memory_store.capacity * ac.partition_limit_memory_backpressure_ratio)
                      if ac.partition_limit_enable else None)
        self.service = ShuffleService(directory=self.directory, app_manager=self.app_manager, memory=self.memory,
                                      disks=self.disks, metrics=self.metrics, huge_partition_limit_bytes=huge_limit,
                                      disk_health=self.disk_health, max_read_length=cfg.grpc_max_message_size,
                                      hdfs=self.hdfs, remote_storages=(self.hdfs_resources.allowed
                                                                       if self.hdfs_resources is not None else None),
                                      max_partitions=ac.partition_number_max_limit,
                                      integrity=self.integrity, crc_check=ac.block_crc_check_enable)
        self.admin = AdminService(
            clock=self.clock, metrics=self.metrics, system=self.system, budget=self.budget, directory=self.directory,
            memory=self.memory, spill=self.spill, app_manager=self.app_manager, disk_monitor=self.disk_monitor,
            disks=self.disks, disk_health=self.disk_health,
            rules=_RiffleHealthRules(min_available_disks=ls.min_number_of_available_disks,
                                     memory_stuck_s=cfg.health.memory_stuck_above_high_watermark_sec,
                                     checks=self.service_health, app_count=lambda: len(self.directory),
                                     memory_used=lambda: self.budget.used),
            escalated=lambda: self.escalated,
            hdfs_app_fallbacks=(self.hdfs_resources.app_fallbacks.__getitem__
                                if self.hdfs_resources is not None else None),
            integrity=self.integrity)

    def _port(self, address: str, port: int | None, key: str) -> int | None:
        """The configured port; under ``fallback_random_ports_enable``, 0 (any) when it is taken."""
        return _port_or_free_one(address, port, key) if self.cfg.fallback_random_ports_enable else port

    async def _start_http(self) -> None:
        cfg = self.cfg
        self._build_service_and_admin()
        assert self.admin is not None
        self._http, self.http_port = await start_http_server(
            self.admin, cfg.http_bind_address, self._port(cfg.http_bind_address, cfg.http_port, "http_port") or 0,
            lifecycle=self.lifecycle, credentials=self.credentials)

    async def _stop_http(self) -> None:
        if self._http is not None:
            await self._http.cleanup()
            self._http = None

    async def _flush_memory(self) -> None:
        """Once no RPC comes in any more: spill what memory holds within the grace period, then write the
        segment records of the last spills."""
        grace = self._grace
        if grace > 0 and self.budget.used and self.app_manager is not None:
            try:
                await asyncio.wait_for(self.app_manager.ask(FlushAllApps()), timeout=grace)
                logger.info("flushed memory to disk before exit")
            except (TimeoutError, Exception) as e:  # noqa: BLE001 - shutdown goes on regardless
                logger.warning("could not flush everything within {}s: {!r}", grace, e)
        if self.meta_log is not None:  # the segment records of the last spills
            try:
                await asyncio.wait_for(self.meta_log.drain(), timeout=max(grace, 1.0))
            except (TimeoutError, Exception) as e:  # noqa: BLE001 - shutdown goes on regardless
                logger.warning("metadata records not all written: {!r}", e)

    async def _start_grpc(self) -> None:
        cfg = self.cfg
        assert self.service is not None
        self.grpc_servicer = ShuffleServerServicer(
            self.service, self.metrics, replies=self.replies,
            max_reply_bytes_per_connection=cfg.grpc_max_reply_bytes_per_connection)
        if not self._serve_grpc:
            return
        self._grpc, self.grpc_port = await start_grpc_server(
            self.grpc_servicer, cfg.grpc_bind_address, self._port(cfg.grpc_bind_address, cfg.grpc_port, "grpc_port") or 0,
            cfg.grpc_max_message_size,
            internal=ShuffleServerInternalServicer(self.lifecycle, self.credentials),
            max_concurrent_streams=cfg.grpc_max_concurrent_streams,
            loop_config=cfg.grpc_loop_config.limits() if cfg.grpc_engine == GrpcEngine.LOOP else None)

    async def _stop_grpc(self) -> None:
        if self._grpc is not None:
            await self._grpc.stop(min(self._grace, 5.0))
            self._grpc = None

    async def _start_urpc(self) -> None:
        cfg = self.cfg
        urpc_port = self._port(cfg.urpc_bind_address, cfg.urpc_port, "urpc_port")
        if urpc_port is None:
            return
        assert self.service is not None
        uc = cfg.urpc_config
        urpc = UrpcServer(self.service, self.metrics, max_frame_bytes=cfg.grpc_max_message_size,
                          max_connections=uc.max_connections,
                          max_connections_per_address=uc.max_connections_per_address,
                          max_inflight_bytes=uc.max_inflight_bytes,
                          max_requests_per_connection=uc.max_requests_per_connection,
                          index_v2=uc.get_index_rpc_version == "V2", sendfile=uc.sendfile_enable,
                          sendfile_stall_s=uc.sendfile_stall_timeout_sec,
                          idle_timeout_s=uc.idle_timeout_sec, frame_timeout_s=uc.frame_read_timeout_sec,
                          frame_min_rate=uc.frame_read_min_bytes_per_sec,
                          max_reply_bytes_per_connection=uc.max_reply_bytes_per_connection,
                          replies=self.replies)
        self.urpc_port = await urpc.start(cfg.urpc_bind_address, urpc_port)
        self._urpc = urpc

    async def _stop_urpc(self) -> None:
        if self._urpc is not None:
            await self._urpc.stop(min(self._grace, 5.0))
            self._urpc = None

    async def _set_identity(self) -> None:
        """The server id and advertised address, from the bound ports: in the HDFS file names, the spans'
        service name and the admin service's identity."""
        if self.worker_ip:
            self.ip = self.worker_ip
        elif self.cfg.coordinator_quorum:
            self.ip = advertised_ip(self.cfg.grpc_bind_address)
        self.server_id = f"{self.ip}-{self.grpc_port}" + (f"-{self.urpc_port}" if self.urpc_port else "")
        logger.info("server id {} (advertised ip {}{})", self.server_id, self.ip,
                    ", from WORKER_IP" if self.worker_ip else "")
        if self.hdfs_resources is not None:
            self.hdfs_resources.server_id = self.server_id  # HDFS file names start with it (spec §5.5)
        self._start_tracing()
        assert self.admin is not None
        self.admin.identity = ServerIdentity(ip=self.ip, grpc_port=self.grpc_port, http_port=self.http_port,
                                             tags=tuple(self.cfg.tags), start_time_ms=self.start_time_ms,
                                             netty_port=self.urpc_port)

    def _start_tracing(self) -> None:
        """``[tracing]``: spans of RPCs and spills (``riffle_actors.tracing``), named after the server id
        as Riffle's (``<jaeger_service_name>-<server id>``)."""
        tc = self.cfg.tracing
        if tc is None:
            return
        service = f"{tc.jaeger_service_name}-{self.server_id}"
        self.metrics.tracer = Tracer.start(tc.jaeger_reporter_endpoint, service, sample_ratio=tc.sample_ratio,
                                           max_queue_size=tc.max_queue_size, export_timeout_ms=tc.export_timeout_ms)
        url = exporter_url(tc.jaeger_reporter_endpoint)
        mapped = "" if "://" in tc.jaeger_reporter_endpoint else (
            f" (Riffle's Jaeger agent address {tc.jaeger_reporter_endpoint}: its host's OTLP/HTTP receiver)")
        logger.info("tracing: spans of service {} to {}{}, sample ratio {}", service, url, mapped, tc.sample_ratio)

    async def _stop_tracer(self) -> None:
        tracer, self.metrics.tracer = self.metrics.tracer, Tracer.off()
        if tracer.enabled:  # the last spans go out (bounded by export_timeout_ms), off the loop
            await asyncio.get_running_loop().run_in_executor(None, tracer.shutdown)

    async def _start_heartbeat(self) -> None:
        if not self.cfg.coordinator_quorum:
            logger.info("no coordinator_quorum: running standalone")
            return
        admin = self.admin
        assert admin is not None
        interval = float(self.cfg.heartbeat_interval_seconds)
        await admin.refresh_snapshot()
        self.heartbeat = await self.system.start_child(None, ChildSpec("heartbeat", lambda: HeartbeatActor(
            self.cfg.coordinator_quorum, interval, self._heartbeat_snapshot, clock=self.clock,
            connect=GrpcCoordinatorLink, refresh=admin.refresh_for_heartbeat)))

    def _heartbeat_snapshot(self) -> HeartbeatSnapshot:
        if self.admin is None:
            raise RuntimeError("no heartbeat before the admin service exists")
        return self.lifecycle.heartbeat_status(self.admin.heartbeat_snapshot())

    async def _heartbeat_now(self) -> None:
        """A heartbeat round now (a decommission or its cancellation reaches the coordinators at once)."""
        if self.heartbeat is not None:
            await self.heartbeat.ask(SendHeartbeatNow())

    async def _announce_stop(self) -> None:
        """Tell every coordinator at once that this server is leaving (bounded: ANNOUNCE_TIMEOUT_S); the
        heartbeat actor itself stops with the others."""
        if self.heartbeat is None:
            return
        try:
            await asyncio.wait_for(self.heartbeat.ask(AnnounceStopping(timeout_s=ANNOUNCE_TIMEOUT_S)),
                                   timeout=ANNOUNCE_TIMEOUT_S + 1.0)
        except Exception as e:  # noqa: BLE001 - the stop goes on; the heartbeat timeout still applies
            logger.warning("could not announce the stop to the coordinators: {!r}", e)

    async def _start_metrics_push(self) -> None:
        """``[metrics] push_gateway_endpoint``: push to a Pushgateway as Riffle does (job ``uniffle-worker``,
        labels ``worker_id`` and ``version``), at once and then every ``push_interval_sec``."""
        if not self.cfg.metrics.push_gateway_endpoint:
            return
        assert self.admin is not None and self.timer is not None
        pusher = MetricsPusher(self.cfg.metrics, registry=self.metrics.registry, job=SERVER_JOB,
                               grouping={"worker_id": self.server_id, "version": __version__},
                               refresh=self.admin.refresh_snapshot, clock=self.clock)
        pusher.describe()
        timer = self.timer
        await self.system.start_child(None, ChildSpec(METRICS_PUSH, lambda: PeriodicJobActor(
            pusher.push_once, timer=timer, key=METRICS_PUSH, interval_s=lambda: pusher.interval_s,
            first_delay_s=0.0, what="metrics push")))

    async def _stop_metrics_push(self) -> None:
        if self.system.get(METRICS_PUSH) is not None:
            await self.system.stop_child(None, METRICS_PUSH)

    async def _start_reload(self) -> None:
        """``conf_reload_enable``: the periodic re-read of the config file (``riffle_actors.reconf``), every
        ``conf_reload_interval_sec`` of the config in force."""
        if not self.cfg.conf_reload_enable:
            return
        if self.config_path is None:
            logger.warning("conf_reload_enable: this server was not started from a config file; nothing to re-read")
            return
        assert self.timer is not None
        reloader = self.reloader = ConfigReloader(self.config_path, current=lambda: self.cfg,
                                                  apply=self.apply_reload, load=self._load_config_fn)
        reloader.remember_current_file()
        timer = self.timer
        await self.system.start_child(None, ChildSpec(CONF_RELOAD, lambda: PeriodicJobActor(
            reloader.check_logged, timer=timer, key=CONF_RELOAD,
            interval_s=lambda: float(self.cfg.conf_reload_interval_sec), what="config reload")))
        logger.info("conf_reload_enable: {} is read again every {}s; reloadable keys: {}", self.config_path,
                    self.cfg.conf_reload_interval_sec, ", ".join(RELOADABLE))

    async def _stop_reload(self) -> None:
        if self.system.get(CONF_RELOAD) is not None:
            await self.system.stop_child(None, CONF_RELOAD)

    async def _close_lifecycle(self) -> None:
        await self.lifecycle.close()

    def apply_reload(self, new: ServerConfig, changes: dict[str, tuple[Any, Any]]) -> None:
        """A reloaded config whose changes are all in ``RELOADABLE``: applied in this one synchronous step
        (the event loop runs nothing else meanwhile, so no request sees half of it)."""
        ac, hs = new.app_config, new.hybrid_store
        limits = self.spill_limits  # shared by every app: their partitions read it on their next write
        limits.huge_threshold_bytes = ac.partition_limit_threshold if ac.partition_limit_enable else None
        limits.split_threshold_bytes = ac.partition_split_threshold if ac.partition_split_enable else None
        if self.service is not None:
            self.service.huge_partition_limit_bytes = (
                int(new.memory_store.capacity * ac.partition_limit_memory_backpressure_ratio)
                if ac.partition_limit_enable else None)
        self.cfg = new  # a restarted MemoryManager takes its watermarks from here
        if any(k.startswith("hybrid_store.") for k in changes) and self.memory is not None:
            try:
                self.memory.tell_nowait(SetWatermarks(high_watermark=hs.memory_spill_high_watermark,
                                                      low_watermark=hs.memory_spill_low_watermark,
                                                      sensitive=hs.sensitive_watermark_spill_enable))
            except (MailboxFullError, ActorDeadError):
                pass  # its next incarnation starts with self.cfg's
        limiter = new.localfile_store.io_limiter
        if "localfile_store.io_limiter.capacity" in changes and limiter is not None:
            for res in self._disk_resources.values():
                if res.throttle is not None:
                    res.throttle.set_capacity(limiter.capacity)
        if "log.level" in changes or "log.log_level" in changes:
            if os.environ.get("RUST_LOG", "").strip():
                logger.warning("config reload: the log level stays as RUST_LOG sets it")
            elif not set_log_level(new.log.effective_level):
                logger.info("config reload: no log sinks of the daemon here; the log level is unchanged")


async def serve(cfg: ServerConfig | HostLaunch, stop_event: asyncio.Event, ports) -> int:
    if isinstance(cfg, HostLaunch):  # runtime_config.worker_number > 1: the parent of the workers
        return await serve_host(cfg, stop_event, ports)
    tune_malloc()  # the daemon only: tests run many servers in one process and keep glibc's defaults
    launch = LaunchEnv.read()  # checked by _load_checked already
    for note in launch.notes():
        logger.info(note)
    threads = cfg.runtime_config.default_thread_num
    if threads is not None:  # Riffle's default runtime ~ the loop's default executor (the daemon only)
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(threads, thread_name_prefix="default"))
    server = ShuffleServer(cfg, worker_ip=launch.worker_ip, config_path=_LOADED_FROM.get("path"),
                           load_config_fn=_reload_config)
    server.request_stop = stop_event.set  # an operator's kill takes the SIGTERM path
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


#: the file the daemon's config came from (``_load_checked``), re-read under conf_reload_enable
_LOADED_FROM: dict[str, str] = {}


def _load_checked(path: str) -> ServerConfig | HostLaunch:
    """``load_config`` plus the ``[admin]`` credentials and Riffle's launch variables (``LaunchEnv``),
    so an unusable one stops the start (exit 2). With ``runtime_config.worker_number`` > 1: a
    ``HostLaunch`` (this process is the parent), or, in a worker the parent started
    (``RIFFLE_WORKER_INDEX`` set), that worker's share of the config (``riffle_actors.workers``)."""
    _LOADED_FROM.setdefault("path", os.path.abspath(path))
    cfg = load_config(path)
    try:
        check_layout(cfg)
    except WorkerLayoutError as e:
        raise ConfigError(path, [(e.key, str(e))]) from None
    n = cfg.runtime_config.worker_number
    index = os.environ.get(ENV_WORKER_INDEX)
    if index is not None:
        if not index.isdigit() or int(index) >= n or os.environ.get(ENV_WORKER_NUMBER) != str(n):
            why = (f"this worker ({ENV_WORKER_INDEX}={index}, {ENV_WORKER_NUMBER}={os.environ.get(ENV_WORKER_NUMBER)}) "
                   f"does not fit worker_number = {n}: the file changed under a running host; restart the host")
            raise ConfigError(path, [("runtime_config.worker_number", why)])
        cfg = worker_config(cfg, int(index))
    try:
        AdminCredentials.resolve(cfg.admin)
    except AdminCredentialError as e:
        raise ConfigError(path, [("admin", str(e))]) from None
    try:
        LaunchEnv.read()
    except ValueError as e:
        raise ConfigError(path, e.args[0]) from None
    try:
        kerberos_login(cfg)
    except ValueError as e:
        raise ConfigError(path, [("hdfs_store.kerberos_security_config", str(e))]) from None
    if n > 1 and index is None:
        return HostLaunch(cfg, path)
    return cfg


def _reload_config(path: str) -> ServerConfig:
    """``conf_reload_enable``'s reader: ``_load_checked`` as this process (one server, or one worker of
    a host) reads the file; a file that now asks for workers is refused (a restart changes that)."""
    cfg = _load_checked(path)
    if isinstance(cfg, HostLaunch):
        raise ConfigError(path, [("runtime_config.worker_number", "changed under a running server: restart it")])
    return cfg


def kerberos_login(cfg: ServerConfig) -> KerberosLogin | None:
    """The server's Kerberos login to HDFS (``[hdfs_store.kerberos_security_config]``), its keytab
    checked (``ValueError`` naming the key); None without it or without an HDFS tier."""
    krb = cfg.hdfs_store.kerberos_security_config
    if krb is None or not cfg.store_type.has_hdfs:
        return None
    login = KerberosLogin(principal=krb.principal, keytab_path=krb.keytab_path)
    login.check()
    return login


def main(argv: list[str] | None = None) -> int:
    """``riffle-server [run] -c/--config PATH ...`` (or ``WORKER_CONFIG_PATH=PATH riffle-server``, Riffle's
    launch line); ``RUST_LOG``, ``WORKER_IP``, ``GRPC_PARALLELISM`` and ``URPC_PARALLELISM`` as in Riffle."""
    from riffle_actors.daemon import run_daemon

    return run_daemon(argv, prog="riffle-server", load_config=_load_checked, log_config=lambda cfg: cfg.log,
                      serve=serve, description="Uniffle-compatible shuffle server (riffle_actors)",
                      config_env="WORKER_CONFIG_PATH")


if __name__ == "__main__":
    sys.exit(main())
