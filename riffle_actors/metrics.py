"""Metrics: the Prometheus metrics of one server, in a registry of its own (no module globals).

Counters and histograms are updated on the data path by the transports, the service and
the spill dispatcher. Gauges that mirror actor state (memory budget, tickets, disks,
mailboxes) are *pulled*: the HTTP handler refreshes a ``StateSnapshot`` from the actors and
the collector reads it, so nothing polls in the background. The one exception is the
``LoopLagMonitor``: a timer every 10 ms that measures how late the event loop runs it
(``riffle_server_event_loop_lag_seconds``, the worst since the previous scrape).

Names follow ``riffle_<subsystem>_<thing>_<unit>``; labels are a small fixed set (``rpc``,
``status``, ``source``, ``disk``, ``actor``), never an app id.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from riffle_actors.reports import DiskReport
from riffle_actors.runtime import MailboxStatistics

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


@dataclass
class StateSnapshot:
    """What the pull collectors read; refreshed by ``AdminService.refresh_snapshot``."""

    capacity: int = 0
    allocated: int = 0
    used: int = 0
    in_flight: int = 0
    tickets: int = 0
    apps: int = 0
    spill_pending: int = 0
    spill_running: int = 0
    spill_stuck: int = 0
    spill_retries_total: int = 0
    disks: tuple[DiskReport, ...] = ()
    actors: list[MailboxStatistics] = field(default_factory=list)
    healthy: bool = True


class _StateCollector:
    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self):
        s = self.metrics.snapshot
        for name, value, doc in (
            ("riffle_memory_capacity_bytes", s.capacity, "write memory capacity"),
            ("riffle_memory_allocated_bytes", s.allocated, "memory reserved by live buffer tickets"),
            ("riffle_memory_used_bytes", s.used, "shuffle data held in memory (staging + in flight)"),
            ("riffle_memory_in_flight_bytes", s.in_flight, "memory being spilled right now"),
            ("riffle_memory_tickets", s.tickets, "live requireBuffer tickets"),
            ("riffle_server_apps", s.apps, "registered applications"),
            ("riffle_spill_pending_jobs", s.spill_pending, "spill jobs waiting for a disk slot"),
            ("riffle_spill_running_jobs", s.spill_running, "spill jobs being written"),
            ("riffle_spill_stuck_batches", s.spill_stuck, "spill batches that failed to reach a disk after "
             "many retries (still in memory, still retried; /health names them)"),
            ("riffle_spill_retries", s.spill_retries_total, "failed spill writes plus pauses without a disk, "
             "since start"),
            ("riffle_server_healthy", int(s.healthy), "1 when the server reports itself healthy"),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
        healthy = GaugeMetricFamily("riffle_disk_healthy", "1 when the disk takes new data", labels=["disk"])
        cap = GaugeMetricFamily("riffle_disk_capacity_bytes", "file system size of the disk", labels=["disk"])
        used = GaugeMetricFamily("riffle_disk_used_bytes", "file system bytes in use", labels=["disk"])
        quarantines = GaugeMetricFamily("riffle_disk_quarantines", "times the disk was quarantined (EIO, ENOSPC, "
                                        "EROFS, timeouts, failed probes)", labels=["disk"])
        probe_failures = GaugeMetricFamily("riffle_disk_probe_failures", "failed or timed-out health probes",
                                           labels=["disk"])
        moved = GaugeMetricFamily("riffle_disk_spills_moved_away", "spill jobs re-routed from this disk to another",
                                  labels=["disk"])
        for d in s.disks:
            healthy.add_metric([d.name], int(d.healthy))
            cap.add_metric([d.name], d.capacity)
            used.add_metric([d.name], d.used)
            quarantines.add_metric([d.name], d.quarantines)
            probe_failures.add_metric([d.name], d.probe_failures)
            moved.add_metric([d.name], d.spills_moved_away)
        yield from (healthy, cap, used, quarantines, probe_failures, moved)
        depth = GaugeMetricFamily("riffle_actor_mailbox_depth", "messages waiting", labels=["actor"])
        restarts = GaugeMetricFamily("riffle_actor_restarts", "restarts by a supervisor", labels=["actor"])
        processed = GaugeMetricFamily("riffle_actor_processed_messages", "messages processed", labels=["actor"])
        grouped: dict[str, list[int]] = {}
        for st in s.actors:
            kind = st.name.split(":", 1)[0]  # app actors are summed: app ids never become labels
            acc = grouped.setdefault(kind, [0, 0, 0])
            acc[0] += st.depth
            acc[1] += st.restarts
            acc[2] += st.processed
        for kind, (d, r, p) in sorted(grouped.items()):
            depth.add_metric([kind], d)
            restarts.add_metric([kind], r)
            processed.add_metric([kind], p)
        yield from (depth, restarts, processed)


class LoopLagMonitor:
    """How late the event loop runs a timer due every ``period_s``: its worst lateness since the last read.

    Lateness is time the loop spent on something else: a long callback, or a C call holding the
    GIL. A stall longer than the period is measured to within about the period (a shorter one
    may fall between two timers). 100 wake-ups a second cost ~0.02 % of a core.
    """

    def __init__(self, period_s: float = 0.01) -> None:
        self.period_s = period_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._max = 0.0

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start on ``loop`` (default: the running one); idempotent."""
        if self._handle is not None:
            return
        self._loop = loop or asyncio.get_running_loop()
        self._due = self._loop.time() + self.period_s
        self._handle = self._loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        self._max = max(self._max, now - self._due)
        self._due = now + self.period_s
        self._handle = self._loop.call_at(self._due, self._tick)

    def take_max(self) -> float:
        """The worst lateness (seconds) since the previous call, which it resets; a timer overdue
        right now counts too. Like prom-client's ``nodejs_eventloop_lag_max_seconds``, the window is
        the time between two scrapes (two scrapers would split it between them)."""
        worst = self._max
        if self._handle is not None and self._loop is not None:
            worst = max(worst, self._loop.time() - self._due)
        self._max = 0.0
        return max(worst, 0.0)


class _LoopLagCollector:
    def __init__(self, monitor: LoopLagMonitor):
        self.monitor = monitor

    def describe(self):  # without it the registry would collect (and reset the maximum) on register
        yield GaugeMetricFamily("riffle_server_event_loop_lag_seconds", "")

    def collect(self):
        yield GaugeMetricFamily("riffle_server_event_loop_lag_seconds",
                                "worst delay of the event loop in running a timer since the previous scrape",
                                value=self.monitor.take_max())


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.rpc_total = Counter("riffle_server_rpc", "RPCs answered", ["rpc", "status"], registry=r)
        self.rpc_seconds = Histogram("riffle_server_rpc_duration_seconds", "RPC latency", ["rpc"],
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self.received_bytes = Counter("riffle_server_received_bytes", "block payload bytes of successful "
                                      "sendShuffleData requests (retried sends count again)", registry=r)
        read = Counter("riffle_server_read_bytes", "bytes served to readers", ["source"], registry=r)
        self.read_memory_bytes = read.labels("memory")
        self.read_local_bytes = read.labels("localfile")
        self.read_index_bytes = read.labels("index")
        self.spill_total = Counter("riffle_spill", "spill batches written", ["disk"], registry=r)
        self.spill_bytes = Counter("riffle_spill_bytes", "bytes spilled to disk", ["disk"], registry=r)
        self.spill_seconds = Histogram("riffle_spill_duration_seconds", "time to write one spill batch", ["disk"],
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.spill_failures = Counter("riffle_spill_failures", "failed spill attempts (retried)", ["disk"],
                                      registry=r)
        self.oversized_sends = Counter("riffle_server_oversized_sends", "sendShuffleData requests refused "
                                       "because they carried more bytes than their ticket reserved", registry=r)
        # restart recovery (riffle_actors.recovery), set once at start
        self.recovery_seconds = Gauge("riffle_recovery_seconds", "time the restart recovery took", registry=r)
        self.recovery_apps = Gauge("riffle_recovery_apps", "apps rebuilt from disk at start", registry=r)
        self.recovery_partitions = Gauge("riffle_recovery_partitions", "partitions rebuilt from disk at start",
                                         registry=r)
        self.recovery_lost_blocks = Counter(
            "riffle_recovery_lost_blocks", "reported blocks a restart found no data for (acknowledged, only in "
            "memory when the server died); per app in /apps", registry=r)
        self.recovery_removed = Counter("riffle_recovery_removed_paths", "directories the restart recovery "
                                        "removed (no usable metadata)", registry=r)
        self.spill_tier_choices = Counter(
            "riffle_spill_tier_choices", "tier chosen per spill attempt and why (store_type with HDFS): reason "
            "huge_partition, cold_threshold, no_healthy_disk, memory_hdfs, localfile, no_remote_storage; "
            "hdfs_unhealthy / hdfs_failed are fallbacks to local disk", ["tier", "reason"], registry=r)
        self.held_reply_bytes = Gauge(
            "riffle_server_held_reply_bytes", "read reply bytes held over gRPC and urpc (being read, or sent and "
            "not yet taken by the client); bounded by max_reply_bytes", registry=r)
        self.snapshot = StateSnapshot()
        r.register(_StateCollector(self))
        self.loop_lag = LoopLagMonitor()  # started and stopped by the server, on its loop
        r.register(_LoopLagCollector(self.loop_lag))

    def on_spill_failed(self, disk: str) -> None:
        self.spill_failures.labels(disk).inc()

    def on_spilled(self, disk: str, data_bytes: int, seconds: float) -> None:
        self.spill_total.labels(disk).inc()
        self.spill_bytes.labels(disk).inc(data_bytes)
        self.spill_seconds.labels(disk).observe(seconds)

    def on_recovered(self, *, seconds: float, apps: int, partitions: int, lost_blocks: int, removed: int) -> None:
        self.recovery_seconds.set(seconds)
        self.recovery_apps.set(apps)
        self.recovery_partitions.set(partitions)
        self.recovery_lost_blocks.inc(lost_blocks)
        self.recovery_removed.inc(removed)

    def on_tier_choice(self, tier: str, reason: str) -> None:
        self.spill_tier_choices.labels(tier, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
