"""AdminService: what riffle-server says about itself, and what an operator may ask it to do.

The second service of the shuffle server, next to ``ShuffleService`` (the data plane): the HTTP
adapter (``riffle_actors.transport.http_server``) and the heartbeat depend on it, never on the
composition root. It owns:

- **health**: ``health()`` gathers a ``HealthReport`` (``riffle_actors.reports``) from the
  actors and decides it with ``HealthRules``, a pure policy: UNHEALTHY when the supervisor tree
  gave up, when fewer disks than ``min_number_of_available_disks`` take data (each bad disk's
  reason is listed), or when memory stayed above the spill high watermark for longer than
  ``memory_stuck_above_high_watermark_sec``;
- **disk reports**: one ``DiskReport`` per data path, from the ``DiskHealthBoard`` verdict, an
  override told to the SpillDispatcher, the spills moved away and the Disk actor's counters
  (``disk_report`` is the pure part);
- **the metrics snapshot**: ``refresh_snapshot()`` fills ``Metrics.snapshot`` (memory, tickets,
  apps, spill queue, disks, mailboxes, health) for the pull collectors; ``refresh_for_heartbeat`` is the
  HeartbeatActor's refresh before each round (a failure marks the server unhealthy);
- **the heartbeat snapshot**: ``heartbeat_snapshot()`` maps the budget (read directly) and the last
  refreshed snapshot to the typed ``HeartbeatSnapshot`` the ``HeartbeatActor`` sends;
- **operator reads and actions**: ``apps()``, ``history()``, ``actor_statistics()``,
  ``probe_disks()`` (a probe round now), ``probe_stats()``.

It owns no state but ``identity`` (set by the composition root once the ports are known): the
actors and boards it reads do.

See also: ``riffle_actors.service`` (the data plane), ``riffle_actors.server`` (the wiring).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loguru import logger

from riffle_actors.state.app_report import AppInfo
from riffle_actors.actors.app_manager import AppDirectory, GetHistory, ListApps
from riffle_actors.actors.heartbeat import AppSnapshot, DiskSnapshot, HeartbeatSnapshot
from riffle_actors.actors.memory import BudgetReport, GetBudget
from riffle_actors.actors.spill import GetSpillStats, SpillStats
from riffle_actors.state.spill_plan import StuckSpill
from riffle_actors.actors.storage_messages import (
    DiskInfo,
    GetDiskInfo,
    GetProbeStats,
    ProbeStats,
    RunProbeRound,
)
from riffle_actors.io.probe import ProbeResult
from riffle_actors.metrics import Metrics
from riffle_actors.reports import DiskReport, HealthReport, MemoryReport
from riffle_actors.runtime import ActorRef, ActorSystem, Clock, MailboxStatistics
from riffle_actors.state.budget import MemoryBudget
from riffle_actors.state.disk_health import DiskHealth, DiskHealthBoard, DiskStatus, HealthPolicy
from riffle_actors.state.integrity import IntegrityLedger

#: How long a Disk actor may take to report its counters before ``/health`` calls it stuck.
DISK_INFO_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class HealthRules:
    """When the server is UNHEALTHY (pure: every input is an argument)."""

    min_available_disks: int
    memory_stuck_s: float  # [health] memory_stuck_above_high_watermark_sec

    def reasons(self, *, escalated: BaseException | None, disks: Sequence[DiskReport],
                above_high_watermark_since: float | None, now: float,
                stuck_spills: Sequence[StuckSpill] = ()) -> tuple[str, ...]:
        """Why the server is unhealthy; empty when it is healthy. ``now`` and
        ``above_high_watermark_since`` are readings of the same monotonic clock."""
        reasons = []
        if escalated is not None:
            reasons.append(f"supervisor tree gave up: {escalated!r}")
        healthy_disks = sum(1 for d in disks if d.healthy)
        if healthy_disks < self.min_available_disks:
            reasons.append(f"{healthy_disks} healthy disks, fewer than "
                           f"min_number_of_available_disks={self.min_available_disks}")
            reasons.extend(f"{d.name}: {d.reason}" for d in disks if not d.healthy)
        since = above_high_watermark_since
        if since is not None and now - since > self.memory_stuck_s:
            reasons.append(f"memory above the spill high watermark for more than {self.memory_stuck_s}s")
        if stuck_spills:
            worst = stuck_spills[0]  # longest waiting first
            reasons.append(
                f"{len(stuck_spills)} spill batches cannot reach a disk (still in memory, still retried); "
                f"longest: app {worst.app_id} shuffle {worst.shuffle_id} partition {worst.partition_id}, "
                f"{worst.data_bytes} bytes, {worst.retries} retries over {worst.waiting_s:.0f}s, "
                f"last error: {worst.last_error}")
        return tuple(reasons)


def disk_report(h: DiskHealth, policy: HealthPolicy, *, override: str | None, moved: dict[str, int],
                now: float, info: DiskInfo | None, info_error: str | None = None) -> DiskReport:
    """One disk's report (pure). ``override``: a reason told to the SpillDispatcher by an operator or a
    test while the board still calls the disk placeable; ``moved``: spill jobs re-routed away from it
    by destination; ``info``: the Disk actor's counters (None with ``info_error`` when it did not answer)."""
    override = override if h.placeable else None
    healthy = h.placeable and override is None
    reason = override or h.describe(policy)
    if not healthy and moved:
        reason += "; " + ", ".join(f"{n} pending spills moved to {to}" for to, n in moved.items())
    capacity, used = h.capacity_bytes, h.used_bytes
    if info is not None and not h.capacity_bytes:
        capacity, used = info.capacity, info.used  # statvfs, until the first probe reported the usage
    if info_error is not None:
        healthy = False
        reason = (reason + "; " if reason else "") + f"disk actor: {info_error}"
    return DiskReport(
        name=h.name, healthy=healthy, status=DiskStatus.QUARANTINED.value if override else h.status.value,
        reason=reason, capacity=capacity, used=used,
        written_bytes=info.written_bytes if info is not None else 0,
        write_failures=info.write_failures if info is not None else 0,
        quarantines=h.quarantines_total, probe_failures=h.probe_failures_total,
        last_probe_age_s=(round(now - h.last_probe_monotonic, 3)
                          if h.last_probe_monotonic is not None else None),
        spills_moved_away=sum(moved.values()))


def riffle_app_fields(i: AppInfo, now_ms: int) -> dict[str, Any]:
    """Riffle's ``/apps?format=Json`` fields of one app (``riffle-server/src/http/apps.rs``), so
    Riffle's own ``riffle-ctl`` reads our listing: resident bytes are memory + disk + HDFS;
    ``partition_split_triggered``: a partition of the app went above ``partition_split_threshold``."""
    shuffles = i.shuffles.values()
    return {"registry_timestamp": i.registered_epoch_ms,
            "duration_minutes": float(max(0, now_ms - i.registered_epoch_ms) // 60_000),
            "resident_bytes": i.memory_bytes + sum(sh.disk_bytes + sh.hdfs_bytes for sh in shuffles),
            "partition_number": i.partition_count,
            "huge_partition_number": sum(sh.huge_partitions for sh in shuffles),
            "reported_block_id_number": sum(sh.reported_block_ids for sh in shuffles),
            "partition_split_triggered": i.partition_split_triggered}


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """How the server presents itself to coordinators (known once its ports are bound)."""

    ip: str
    grpc_port: int
    http_port: int
    tags: tuple[str, ...]
    start_time_ms: int
    netty_port: int = 0  # the urpc port; 0 = urpc off


class AdminService:
    """See the module docstring."""

    def __init__(self, *, clock: Clock, metrics: Metrics, system: ActorSystem, budget: MemoryBudget,
                 directory: AppDirectory, memory: ActorRef, spill: ActorRef, app_manager: ActorRef,
                 disk_monitor: ActorRef, disks: Sequence[tuple[str, ActorRef]], disk_health: DiskHealthBoard,
                 rules: HealthRules, escalated: Callable[[], BaseException | None],
                 hdfs_app_fallbacks: Callable[[str], int] | None = None,
                 integrity: IntegrityLedger | None = None):
        self.integrity = integrity  # read-only here: per-app corrupt / refused / repaired block counts
        self.hdfs_app_fallbacks = hdfs_app_fallbacks  # app -> spills sent local after HDFS failed (HDFS tier)
        self.clock = clock
        self.metrics = metrics
        self.system = system
        self.budget = budget
        self.directory = directory
        self.memory = memory
        self.spill = spill
        self.app_manager = app_manager
        self.disk_monitor = disk_monitor
        self.disks = list(disks)
        self.disk_health = disk_health
        self.rules = rules
        self.escalated = escalated
        self.identity: ServerIdentity | None = None

    # ------------------------------------------------------------- health
    async def disk_reports(self, stats: SpillStats | None = None) -> tuple[DiskReport, ...]:
        if stats is None:
            stats = await self.spill.ask(GetSpillStats())
        reports = []
        for name, ref in self.disks:
            h = self.disk_health[name]
            info: DiskInfo | None = None
            error: str | None = None
            try:
                # counters only; the usage (statvfs) only until the first probe reported it
                info = await ref.ask(GetDiskInfo(with_usage=not h.capacity_bytes),
                                     timeout=DISK_INFO_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001 - a dead or stuck disk is reported, not raised
                error = repr(e)
            reports.append(disk_report(h, self.disk_health.policy, override=stats.unhealthy_disks.get(name),
                                       moved=stats.moved_from(name), now=self.clock.monotonic(), info=info,
                                       info_error=error))
        return tuple(reports)

    async def health(self) -> HealthReport:
        return await self._health(await self.spill.ask(GetSpillStats()), await self.memory.ask(GetBudget()))

    async def _health(self, stats: SpillStats, report: BudgetReport) -> HealthReport:
        disks = await self.disk_reports(stats)
        reasons = self.rules.reasons(escalated=self.escalated(), disks=disks,
                                     above_high_watermark_since=report.above_high_watermark_since,
                                     now=self.clock.monotonic(), stuck_spills=stats.stuck)
        b = report.budget
        return HealthReport(reasons=reasons, disks=disks, memory=MemoryReport(
            capacity=b.capacity, used=b.used, allocated=b.allocated, in_flight=b.in_flight))

    # ------------------------------------------------------------- metrics snapshot
    async def refresh_snapshot(self) -> None:
        """Fill ``Metrics.snapshot`` from the actors (what ``/metrics`` and the heartbeat read)."""
        s = self.metrics.snapshot
        report = await self.memory.ask(GetBudget())
        s.capacity, s.allocated, s.used, s.in_flight = (report.budget.capacity, report.budget.allocated,
                                                        report.budget.used, report.budget.in_flight)
        s.tickets = report.tickets
        s.apps = len(self.directory)
        stats = await self.spill.ask(GetSpillStats())
        s.spill_pending, s.spill_running = stats.pending, stats.running
        s.spill_stuck, s.spill_retries_total = len(stats.stuck), stats.retries_total
        health = await self._health(stats, report)
        s.disks = health.disks
        s.actors = self.system.statistics()
        s.healthy = health.healthy

    async def render_metrics(self) -> bytes:
        """Prometheus text, refreshed from the actors first."""
        await self.refresh_snapshot()
        return await self.metrics.render_off_loop()

    async def refresh_for_heartbeat(self) -> None:
        """The heartbeat's refresh: a failure marks the server unhealthy (reported), never raises."""
        try:
            await self.refresh_snapshot()
        except Exception as e:  # noqa: BLE001 - reported as unhealthy, never fatal
            self.metrics.snapshot.healthy = False
            logger.warning("could not refresh server state: {!r}", e)

    def heartbeat_snapshot(self) -> HeartbeatSnapshot:
        """What the HeartbeatActor sends: the budget (read directly) and the last refreshed snapshot."""
        ident = self.identity
        if ident is None:
            raise RuntimeError("the server identity is not known yet (ports not bound)")
        b = self.budget
        snap = self.metrics.snapshot
        disks = tuple(DiskSnapshot(path=d.name, capacity_bytes=d.capacity, used_bytes=d.used,
                                   status="NORMAL" if d.healthy else
                                   "OVERUSED" if d.status == DiskStatus.OVERUSED.value else "UNHEALTHY")
                      for d in snap.disks)
        return HeartbeatSnapshot(
            ip=ident.ip, grpc_port=ident.grpc_port, http_port=ident.http_port, netty_port=ident.netty_port,
            tags=ident.tags,
            used_memory=b.used + b.allocated, pre_allocated_memory=b.allocated,
            available_memory=max(0, b.capacity - b.used - b.allocated),
            event_num_in_flush=snap.spill_pending + snap.spill_running,
            is_healthy=snap.healthy and self.escalated() is None, disks=disks,
            start_time_ms=ident.start_time_ms,
            # the apps this server holds (those rebuilt by a restart's recovery included)
            apps=tuple(AppSnapshot(app_id=app_id) for app_id in self.directory),
            integrity=self.integrity.totals() if self.integrity is not None else ())

    # ------------------------------------------------------------- operator reads and actions
    async def apps(self) -> list[dict[str, Any]]:
        """Every app: our fields plus Riffle's ``AppInfo`` fields (``riffle_app_fields``)."""
        infos = await self.app_manager.ask(ListApps())
        now_ms = int(self.clock.time() * 1000)
        return [{"app_id": i.app_id, "user": i.user, "registered_epoch_ms": i.registered_epoch_ms,
                 "idle_s": round(i.idle_s, 3), "partition_count": i.partition_count,
                 "memory_bytes": i.memory_bytes, "in_flight_bytes": i.in_flight_bytes,
                 "disk_bytes": sum(sh.disk_bytes for sh in i.shuffles.values()),
                 "hdfs_bytes": sum(sh.hdfs_bytes for sh in i.shuffles.values()),
                 **({"hdfs_fallbacks": self.hdfs_app_fallbacks(i.app_id)} if self.hdfs_app_fallbacks else {}),
                 "received_bytes": i.received_bytes,
                 "recovered": i.recovered, "lost_blocks": i.lost_blocks,
                 **self._integrity_fields(i.app_id),
                 **riffle_app_fields(i, now_ms),
                 "shuffles": {sid: {f: getattr(sh, f) for f in sh.__dataclass_fields__}
                              for sid, sh in i.shuffles.items()}} for i in infos]

    def _integrity_fields(self, app_id: str) -> dict[str, int]:
        """``corrupt_blocks`` (found on disk by a scrubber), ``corrupt_reads_refused``, ``refused_blocks``
        (refused at ingest for a crc mismatch) and ``repaired_blocks`` (of those, resent intact)."""
        a = self.integrity.app(app_id) if self.integrity is not None else None
        if a is None:
            return {"corrupt_blocks": 0, "corrupt_reads_refused": 0, "refused_blocks": 0, "repaired_blocks": 0}
        return {"corrupt_blocks": a.corrupt_blocks, "corrupt_reads_refused": a.corrupt_reads_refused,
                "refused_blocks": a.refused_blocks, "repaired_blocks": a.repaired_blocks}

    def app_count(self) -> int:
        """Riffle's ``/apps/number``."""
        return len(self.directory)

    async def history(self) -> list[dict[str, Any]]:
        """Purged apps, oldest first, in Riffle's ``/apps/history`` form (``riffle_actors.actors.app_manager.
        history_record``: its per-app totals, ``end_timestamp`` = the purge time) plus ``reason``."""
        return [dict(h) for h in await self.app_manager.ask(GetHistory())]

    def actor_statistics(self) -> list[MailboxStatistics]:
        return self.system.statistics()

    async def probe_disks(self) -> dict[str, ProbeResult | None]:
        """Run a disk probe round now (one also runs every ``disk_healthy_check_interval_sec``)."""
        result: dict[str, ProbeResult | None] = await self.disk_monitor.ask(RunProbeRound())
        return result

    async def probe_stats(self) -> ProbeStats:
        stats: ProbeStats = await self.disk_monitor.ask(GetProbeStats())
        return stats

