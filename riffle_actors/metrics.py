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
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from riffle_actors.reports import DiskReport
from riffle_actors.runtime import MailboxStatistics
from riffle_actors.tracing import GRPC_SERVICE_PATH, Tracer

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
        for kind, (depth_sum, r, p) in sorted(grouped.items()):
            depth.add_metric([kind], depth_sum)
            restarts.add_metric([kind], r)
            processed.add_metric([kind], p)
        yield from (depth, restarts, processed)


#: Riffle's metric names served here (``metrics.rs`` of zuston/riffle), each read from our own
#: metrics at scrape time: nothing is counted twice on the data path. docs/riffle-metrics.md lists
#: the Riffle names that have no counterpart here.
RIFFLE_METRIC_NAMES = (
    "memory_capacity", "memory_used", "memory_allocated", "memory_allocated_tickets_num",
    "memory_spill_in_flight_bytes", "memory_spill_in_flushing_operations", "app_number", "service_is_healthy",
    "local_disk_is_healthy", "local_disk_capacity", "local_disk_used", "local_disk_used_ratio",
    "total_received_data", "total_read_data", "total_read_data_from_memory", "total_read_data_from_localfile",
    "total_read_index_from_localfile", "total_grpc_request_number", "total_urpc_request_number",
    "grpc_duration_seconds", "total_require_buffer_failed", "total_memory_spill_to_localfile",
    "total_memory_spill_to_hdfs", "total_memory_spill_failed", "total_localfile_used", "total_hdfs_used",
    "localfile_disk_append_operation_counter", "localfile_disk_append_operation_bytes_counter",
    "localfile_disk_append_operation_duration", "memory_spill_batch_size_histogram",
    "total_memory_to_localfile_spill_failed", "total_memory_to_hdfs_spill_failed", "total_memory_used",
    "grpc_send_data_process_time", "grpc_get_memory_data_process_time", "grpc_get_localfile_data_process_time",
    "urpc_send_data_process_time", "urpc_get_memory_data_process_time", "urpc_get_localfile_data_process_time",
    "process_resident_memory_bytes", "process_virtual_memory_bytes",
    "total_localfile_detected_in_consistency", "read_ahead_operations", "read_ahead_bytes",
)

_GRPC_SERVICE = "/rss.common.ShuffleServer/"
#: Riffle's per-RPC process-time histograms -> our ``rpc`` label (the handler's time, receive to reply)
_RPC_TIMES = (
    ("grpc_send_data_process_time", "sendShuffleData"),
    ("grpc_get_memory_data_process_time", "getMemoryShuffleData"),
    ("grpc_get_localfile_data_process_time", "getLocalShuffleData"),
    ("urpc_send_data_process_time", "urpc:sendShuffleData"),
    ("urpc_get_memory_data_process_time", "urpc:getMemoryShuffleData"),
    ("urpc_get_localfile_data_process_time", "urpc:getLocalShuffleData"),
)
_SPILL_SIZE_BUCKETS = (1 << 10, 64 << 10, 1 << 20, 8 << 20, 32 << 20, 128 << 20, 512 << 20, 1 << 30)


def _counter(name: str, doc: str, value: float | None = None, labels: list[str] | None = None) -> Metric:
    """A counter exposed under exactly ``name``, as Riffle's Rust client does; add labelled samples
    with ``_add``. Typed ``untyped``: prometheus_client would name a ``counter`` family ``name_total``
    in its ``# TYPE`` line, which no longer matches the samples; ``rate()`` works the same."""
    family = Metric(name, doc, "unknown")
    family.label_names = labels or []  # type: ignore[attr-defined]
    if value is not None:
        family.add_sample(name, {}, value)
    return family


def _add(family: Metric, values: list[str], value: float) -> None:
    family.add_sample(family.name, dict(zip(family.label_names, values, strict=True)), value)  # type: ignore[attr-defined]


def _samples(metric, suffix: str = "_total"):
    """``(labels, value)`` of the samples of ``metric`` whose name ends with ``suffix``."""
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith(suffix):
                yield sample.labels, sample.value


class _RiffleNamesCollector:
    """Riffle's names and label conventions (``path``, ``root``, ``storage_type``; a health gauge that
    is 0 when healthy and 1 when not, as Riffle sets it), derived from our own metrics at scrape time so
    that Riffle's Grafana dashboards show every panel whose concept exists here. With a push gateway
    the grouping key adds ``worker_id`` and job ``uniffle-worker``, as Riffle's push does."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def describe(self):
        return []  # collected only when scraped

    def collect(self):
        m, s = self.metrics, self.metrics.snapshot
        for name, value, doc in (
            ("memory_capacity", s.capacity, "memory capacity (riffle_memory_capacity_bytes)"),
            ("memory_used", s.used, "memory used (riffle_memory_used_bytes)"),
            ("memory_allocated", s.allocated, "memory reserved by tickets (riffle_memory_allocated_bytes)"),
            ("memory_allocated_tickets_num", s.tickets, "live tickets (riffle_memory_tickets)"),
            ("memory_spill_in_flight_bytes", s.in_flight, "memory being spilled (riffle_memory_in_flight_bytes)"),
            ("memory_spill_in_flushing_operations", s.spill_running, "spill jobs being written"),
            ("app_number", s.apps, "registered applications (riffle_server_apps)"),
            ("service_is_healthy", 0 if s.healthy else 1, "0 when healthy, 1 when not (Riffle's convention)"),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
        disk_healthy = GaugeMetricFamily("local_disk_is_healthy", "0 when the disk takes data, 1 when not "
                                         "(Riffle's convention)", labels=["root"])
        capacity = GaugeMetricFamily("local_disk_capacity", "file system size of the disk", labels=["root"])
        used = GaugeMetricFamily("local_disk_used", "file system bytes in use", labels=["root"])
        ratio = GaugeMetricFamily("local_disk_used_ratio", "used / capacity", labels=["root"])
        for d in s.disks:
            disk_healthy.add_metric([d.name], 0 if d.healthy else 1)
            capacity.add_metric([d.name], d.capacity)
            used.add_metric([d.name], d.used)
            ratio.add_metric([d.name], d.used / d.capacity if d.capacity else 0.0)
        yield from (disk_healthy, capacity, used, ratio)

        yield _counter("total_localfile_detected_in_consistency", "index reads inconsistent with their data file "
                       "(riffle_localfile_index_inconsistencies_total)",
                       sum(v for _labels, v in _samples(m.index_inconsistencies)))
        yield _counter("read_ahead_operations", "read-ahead loads asked of the kernel (riffle_localfile_read_ahead_total"
                       "{outcome=\"loaded\"})",
                       sum(v for labels, v in _samples(m.read_ahead) if labels.get("outcome") == "loaded"))
        yield _counter("read_ahead_bytes", "bytes read ahead (riffle_localfile_read_ahead_bytes_total)",
                       sum(v for _labels, v in _samples(m.read_ahead_bytes)))
        yield _counter("total_received_data", "block bytes received",
                       sum(v for _labels, v in _samples(m.received_bytes)))
        read = {labels["source"]: value for labels, value in _samples(m.read_bytes)}
        yield _counter("total_read_data", "bytes served to readers", sum(read.values()))
        for name, source in (("total_read_data_from_memory", "memory"), ("total_read_data_from_localfile", "localfile"),
                             ("total_read_index_from_localfile", "index")):
            yield _counter(name, f"bytes served from {source}", read.get(source, 0.0))

        grpc_total = _counter("total_grpc_request_number", "gRPC requests", labels=["path"])
        urpc_total = _counter("total_urpc_request_number", "urpc requests", labels=["path"])
        by_rpc: dict[str, float] = {}
        require_failed = 0.0
        for labels, value in _samples(m.rpc_total):
            by_rpc[labels["rpc"]] = by_rpc.get(labels["rpc"], 0.0) + value
            if labels["rpc"] == "requireBuffer" and labels["status"] != "SUCCESS":
                require_failed += value
        grpc = {rpc: v for rpc, v in by_rpc.items() if not rpc.startswith("urpc:")}
        urpc = {rpc[5:]: v for rpc, v in by_rpc.items() if rpc.startswith("urpc:")}
        _add(grpc_total, ["ALL"], sum(grpc.values()))
        _add(urpc_total, ["ALL"], sum(urpc.values()))
        for rpc, calls in sorted(grpc.items()):
            _add(grpc_total, [_GRPC_SERVICE + rpc], calls)
        for rpc, calls in sorted(urpc.items()):
            _add(urpc_total, [rpc], calls)
        yield from (grpc_total, urpc_total)
        yield _counter("total_require_buffer_failed", "requireBuffer refusals", require_failed)
        rpc_series = _histogram_series(m.rpc_seconds, "rpc")  # read once, for the 7 families made of it
        yield _histogram_as(m.rpc_seconds, "grpc_duration_seconds", "gRPC latency", "rpc", "path",
                            lambda rpc: None if rpc.startswith("urpc:") else _GRPC_SERVICE + rpc, rpc_series)

        spills = {labels["disk"]: value for labels, value in _samples(m.spill_total)}
        spilled = {labels["disk"]: value for labels, value in _samples(m.spill_bytes)}
        hdfs = _HDFS_DISK_LABEL
        yield _counter("total_memory_spill_to_localfile", "spill batches written to local disks",
                       sum(v for d, v in spills.items() if d != hdfs))
        yield _counter("total_memory_spill_to_hdfs", "spill batches written to HDFS", spills.get(hdfs, 0.0))
        yield _counter("total_localfile_used", "bytes spilled to local disks",
                       sum(v for d, v in spilled.items() if d != hdfs))
        yield _counter("total_hdfs_used", "bytes spilled to HDFS", spilled.get(hdfs, 0.0))
        yield _counter("total_memory_spill_failed", "failed spill attempts",
                       sum(v for _labels, v in _samples(m.spill_failures)))
        ops = _counter("localfile_disk_append_operation_counter", "spill appends", labels=["root"])
        ops_bytes = _counter("localfile_disk_append_operation_bytes_counter", "bytes appended", labels=["root"])
        for disk in sorted(d for d in spills if d != hdfs):
            _add(ops, [disk], spills[disk])
            _add(ops_bytes, [disk], spilled.get(disk, 0.0))
        yield from (ops, ops_bytes)
        yield _histogram_as(m.spill_seconds, "localfile_disk_append_operation_duration", "spill append time",
                            "disk", "root", lambda disk: None if disk == hdfs else disk)
        yield _histogram_as(m.spill_batch_bytes, "memory_spill_batch_size_histogram", "bytes of one spill batch",
                            None, None, None)
        yield _counter("total_memory_to_localfile_spill_failed", "failed spill attempts to local disks",
                       sum(v for labels, v in _samples(m.spill_failures) if labels["disk"] != hdfs))
        yield _counter("total_memory_to_hdfs_spill_failed", "failed HDFS spill writes (each fell back to local disk)",
                       sum(v for labels, v in _samples(m.spill_tier_choices) if labels["reason"] == "hdfs_failed"))
        yield _counter("total_memory_used", "bytes put into memory", sum(v for _l, v in _samples(m.received_bytes)))
        for name, rpc in _RPC_TIMES:
            yield _histogram_as(m.rpc_seconds, name, f"time to process {rpc}", "rpc", None,
                                lambda label, rpc=rpc: "" if label == rpc else None, rpc_series)


_HDFS_DISK_LABEL = "hdfs"  # the ``disk`` label of spills to HDFS (``state.tier_policy.Tier.HDFS``)

_LEGACY_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LEGACY_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary",
          "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")


class _NotLegacy(Exception):
    """A name outside the legacy character set: prometheus_client's renderer escapes it."""


def _value_text(v: str) -> str:
    if "\\" in v or "\n" in v or '"' in v:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return v


def render_text(families: Iterable[Metric], registry: CollectorRegistry) -> bytes:
    """The Prometheus text format (0.0.4) of ``families`` (``registry.collect()``): what
    ``prometheus_client.generate_latest(registry)`` writes, byte for byte (a test compares them), for
    about a third less CPU: names are checked once per family, label set and sample name instead of
    escaped per sample, and label values are escaped only when they hold one of the three characters. A metric or
    label name outside the legacy character set falls back to ``generate_latest`` for the whole page."""
    out: list[str] = []
    add = out.append
    labels_seen: dict[tuple[str, ...], None] = {}
    names_seen: dict[str, None] = {}
    try:
        for metric in families:
            name, mtype = metric.name, metric.type
            if _LEGACY_NAME.fullmatch(name) is None:
                raise _NotLegacy(name)
            shown = name + "_total" if mtype == "counter" else name + "_info" if mtype == "info" else name
            doc = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n")
            add(f"# HELP {shown} {doc}\n# TYPE {shown} {_TYPES.get(mtype, mtype)}\n")
            om: dict[str, list[str]] = {}
            for sample in metric.samples:
                labels = sample.labels
                if labels:
                    keys = tuple(labels)
                    if keys not in labels_seen:
                        if any(_LEGACY_LABEL.fullmatch(k) is None for k in keys):
                            raise _NotLegacy(str(keys))
                        labels_seen[keys] = None
                    text = ",".join([f'{k}="{_value_text(v)}"' for k, v in sorted(labels.items())])
                    line = f"{sample.name}{{{text}}} {floatToGoString(sample.value)}"
                else:
                    line = f"{sample.name} {floatToGoString(sample.value)}"
                if sample.timestamp is not None:
                    line += f" {int(float(sample.timestamp) * 1000):d}"
                if sample.name not in names_seen:
                    if _LEGACY_NAME.fullmatch(sample.name) is None:
                        raise _NotLegacy(sample.name)
                    names_seen[sample.name] = None
                suffix = sample.name[len(name):] if sample.name.startswith(name) else ""
                if suffix in _OM_SUFFIXES:
                    om.setdefault(suffix, []).append(line + "\n")
                else:
                    add(line + "\n")
            for suffix, lines in sorted(om.items()):
                add(f"# HELP {name}{suffix} {doc}\n# TYPE {name}{suffix} gauge\n")
                out.extend(lines)
    except _NotLegacy:
        return generate_latest(registry)
    return "".join(out).encode("utf-8")


def _histogram_series(metric, label: str | None) -> dict[str, dict]:
    """The series of ``metric`` (a prometheus_client Histogram with at most the one label ``label``):
    label value ("" without it) -> its cumulative ``buckets`` [(le, count)] and ``sum``."""
    series: dict[str, dict] = {}
    for family in metric.collect():
        for sample in family.samples:
            key = sample.labels.get(label, "") if label else ""
            entry = series.setdefault(key, {"buckets": [], "sum": 0.0})
            if sample.name.endswith("_bucket"):
                entry["buckets"].append((sample.labels["le"], sample.value))
            elif sample.name.endswith("_sum"):
                entry["sum"] = sample.value
    return series


def _histogram_as(metric, name: str, doc: str, label: str | None, new_label: str | None, rename,
                  series: dict[str, dict] | None = None):
    """``metric`` (a prometheus_client Histogram) under another name, its ``label`` renamed to
    ``new_label`` with values mapped by ``rename`` (None drops the series); ``series``: its
    ``_histogram_series``, when the caller read it already for another family."""
    out = HistogramMetricFamily(name, doc, labels=[new_label] if new_label else None)
    # (with new_label None, rename picks the one series kept, answering "" for it)
    if series is None:
        series = _histogram_series(metric, label)
    kept = 0
    for key, entry in sorted(series.items()):
        value = rename(key) if rename is not None else key
        if value is None:
            continue
        out.add_metric([value] if new_label else [], entry["buckets"], entry["sum"])
        kept += 1
    if not new_label and not kept:  # an unlabelled histogram exists from the start, as Riffle's do
        bounds = metric._upper_bounds
        out.add_metric([], [(floatToGoString(b), 0.0) for b in bounds], 0.0)
    return out


class LoopLagMonitor:
    """How late the event loop runs a timer due every ``period_s``: its worst lateness since the last read.

    Lateness is time the loop spent on something else: a long callback, or a C call holding the
    GIL. A stall longer than the period is measured to within about the period (a shorter one
    may fall between two timers).

    **Idle is free.** ``busy()`` (default: always) says whether the server has work (the server:
    it holds an app); once it has said no for ``linger_s`` (the tail of a purge, a late read), the
    timer runs every ``idle_period_s`` instead (1 s: an idle server wakes once a second for it, not
    100 times; that was ~80 % of an idle server's CPU). A stall of an idle loop is still seen when
    it outlasts that period; the first tick after the server gets work returns to ``period_s``.
    """

    def __init__(self, period_s: float = 0.01, *, idle_period_s: float = 1.0, linger_s: float = 10.0,
                 busy: Callable[[], bool] | None = None) -> None:
        self.period_s = period_s
        self.idle_period_s = max(period_s, idle_period_s)
        self.linger_s = linger_s
        self.busy = busy
        self._last_busy = float("-inf")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._max = 0.0
        self.ticks = 0

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start on ``loop`` (default: the running one); idempotent."""
        if self._handle is not None:
            return
        self._loop = loop or asyncio.get_running_loop()
        self._due = self._loop.time() + self._period()
        self._handle = self._loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _period(self) -> float:
        if self.busy is None:
            return self.period_s
        assert self._loop is not None
        now = self._loop.time()
        if self.busy():
            self._last_busy = now
        return self.period_s if now - self._last_busy < self.linger_s else self.idle_period_s

    def _tick(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        self.ticks += 1
        self._max = max(self._max, now - self._due)
        self._due = now + self._period()
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
        #: spans of the same measurements (``[tracing]``; the server starts a real one): RPCs and spills
        self.tracer: Tracer = Tracer.off()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.rpc_total = Counter("riffle_server_rpc", "RPCs answered", ["rpc", "status"], registry=r)
        self.rpc_seconds = Histogram("riffle_server_rpc_duration_seconds", "RPC latency", ["rpc"],
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self._rpc_children: dict[tuple[str, str], tuple] = {}  # (rpc, status) -> (counter, histogram) children
        self.received_bytes = Counter("riffle_server_received_bytes", "block payload bytes of successful "
                                      "sendShuffleData requests (retried sends count again)", registry=r)
        read = self.read_bytes = Counter("riffle_server_read_bytes", "bytes served to readers", ["source"],
                                         registry=r)
        self.read_memory_bytes = read.labels("memory")
        self.read_local_bytes = read.labels("localfile")
        self.read_index_bytes = read.labels("index")
        self.spill_total = Counter("riffle_spill", "spill batches written", ["disk"], registry=r)
        self.spill_bytes = Counter("riffle_spill_bytes", "bytes spilled to disk", ["disk"], registry=r)
        self.spill_seconds = Histogram("riffle_spill_duration_seconds", "time to write one spill batch", ["disk"],
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.spill_batch_bytes = Histogram("riffle_spill_batch_bytes", "bytes of one spill batch",
                                           buckets=_SPILL_SIZE_BUCKETS, registry=r)
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
        self.recovery_remote_storage_refused = Counter(
            "riffle_recovery_remote_storage_refused", "recovered apps whose remote storage is no longer in "
            "hdfs_store.remote_storage (their HDFS files are not touched)", registry=r)
        self.recovery_foreign = Counter("riffle_recovery_foreign_entries", "entries under the data paths the restart "
                                        "recovery left alone (symlinks, FIFOs, devices, names the server never "
                                        "writes)", registry=r)
        self.hdfs_lost_bytes = Counter(
            "riffle_hdfs_lost_bytes", "acknowledged bytes an HDFS file no longer held once lease recovery closed it "
            "after a failed write (each case is logged as an error)", registry=r)
        self.spill_tier_choices = Counter(
            "riffle_spill_tier_choices", "tier chosen per spill attempt and why (store_type with HDFS): reason "
            "huge_partition, cold_threshold, no_healthy_disk, memory_hdfs, localfile, no_remote_storage; "
            "hdfs_unhealthy / hdfs_failed are fallbacks to local disk", ["tier", "reason"], registry=r)
        # [localfile_store.io_limiter]: counted from the disks' IO threads (prometheus counters are thread-safe)
        self.disk_throttled_seconds = Counter(
            "riffle_disk_throttled_seconds", "seconds disk IO waited for the disk throttle (io_limiter); op read "
            "or write", ["disk", "op"], registry=r)
        self.disk_throttle_bytes = Counter(
            "riffle_disk_throttle_bytes", "bytes charged to the disk throttle (io_limiter); op read or write",
            ["disk", "op"], registry=r)
        self.index_inconsistencies = Counter(
            "riffle_localfile_index_inconsistencies", "index reads whose last record does not end where the data "
            "file ends (index_consistency_detection_enable)", ["disk"], registry=r)
        # [localfile_store.read_ahead_options]: counted on the event loop as each load ends
        self.read_ahead = Counter(
            "riffle_localfile_read_ahead", "read-ahead loads (posix_fadvise WILLNEED) by kind (sequential, "
            "read_plan) and outcome (loaded, gone, missed, ignored, failed)", ["disk", "kind", "outcome"], registry=r)
        self.read_ahead_bytes = Counter(
            "riffle_localfile_read_ahead_bytes", "bytes asked of the kernel by loaded read-aheads",
            ["disk", "kind"], registry=r)
        self.held_reply_bytes = Gauge(
            "riffle_server_held_reply_bytes", "read reply bytes held over gRPC and urpc (being read, or sent and "
            "not yet taken by the client); bounded by max_reply_bytes", registry=r)
        # integrity (docs/faults.md "Integrity"): the ingest CRC check, the scrubbers, refused reads
        self.crc_refused_sends = Counter(
            "riffle_server_crc_refused_sends", "sendShuffleData requests refused whole because a block's bytes did "
            "not match its crc ([app_config] block_crc_check_enable)", registry=r)
        self.crc_refused_blocks = Counter(
            "riffle_server_crc_refused_blocks", "blocks of the sends refused for a crc mismatch (nothing stored)",
            registry=r)
        self.crc_repaired_blocks = Counter(
            "riffle_server_crc_repaired_blocks", "blocks refused for a crc mismatch that the client then resent "
            "intact (accepted)", registry=r)
        self.crc_check_seconds = Counter(
            "riffle_server_crc_check_seconds", "time spent checking the crc of received blocks", registry=r)
        self.crc_checked_bytes = Counter(
            "riffle_server_crc_checked_bytes", "block bytes whose crc was checked on arrival", registry=r)
        self.corrupt_reads_refused = Counter(
            "riffle_server_corrupt_reads_refused", "getLocalShuffleData requests refused because the range holds "
            "a block the scrubber (or the read crc check) found corrupt", registry=r)
        self.scrub_bytes = Counter("riffle_scrub_bytes", "data file bytes re-read and checked by the scrubber",
                                   ["disk"], registry=r)
        self.scrub_blocks = Counter("riffle_scrub_blocks", "blocks checked by the scrubber", ["disk"], registry=r)
        self.scrub_corrupt_blocks = Counter(
            "riffle_scrub_corrupt_blocks", "blocks the scrubber found corrupt (bytes do not match the index crc)",
            ["disk"], registry=r)
        self.read_crc_checked_bytes = Counter(
            "riffle_read_crc_checked_bytes", "bytes of local data reads checked against their index crc before "
            "they were served ([localfile_store] read_crc_check_enable)", ["disk"], registry=r)
        self.read_crc_checked_blocks = Counter(
            "riffle_read_crc_checked_blocks", "blocks of local data reads checked against their index crc",
            ["disk"], registry=r)
        self.read_crc_corrupt_blocks = Counter(
            "riffle_read_crc_corrupt_blocks", "blocks the read crc check found corrupt (their read is refused, "
            "they count in corrupt_blocks as the scrubber's finds do)", ["disk"], registry=r)
        self.scrub_passes = Counter("riffle_scrub_passes", "scrub passes completed over a disk's data files",
                                    ["disk"], registry=r)
        self.snapshot = StateSnapshot()
        r.register(_StateCollector(self))
        self.loop_lag = LoopLagMonitor()  # started and stopped by the server, on its loop
        r.register(_LoopLagCollector(self.loop_lag))
        r.register(_RiffleNamesCollector(self))
        ProcessCollector(registry=r)  # process_resident_memory_bytes & co., Riffle's dashboards read them

    def on_spill_failed(self, disk: str) -> None:
        self.spill_failures.labels(disk).inc()

    def on_spilled(self, disk: str, data_bytes: int, seconds: float) -> None:
        self.spill_total.labels(disk).inc()
        self.spill_bytes.labels(disk).inc(data_bytes)
        self.spill_batch_bytes.observe(data_bytes)
        self.spill_seconds.labels(disk).observe(seconds)
        if self.tracer.enabled:
            end = time.time_ns()
            self.tracer.record("spill", end - int(seconds * 1e9), end, {"disk": disk, "data_bytes": data_bytes})

    def on_rpc(self, rpc: str, status_name: str, started: float, app_id: str = "") -> None:
        """One answered RPC (``started``: its ``time.perf_counter()``): counted, timed and, with
        ``[tracing]``, one span named as Riffle's (the gRPC method path; urpc ones ``urpc:<method>``)."""
        seconds = time.perf_counter() - started
        # the counter and histogram children are looked up once per (rpc, status): a labels() lookup
        # costs several times the increment
        children = self._rpc_children.get((rpc, status_name))
        if children is None:
            children = self._rpc_children[(rpc, status_name)] = (self.rpc_total.labels(rpc, status_name),
                                                                 self.rpc_seconds.labels(rpc))
        children[0].inc()
        children[1].observe(seconds)
        if self.tracer.enabled:
            end = time.time_ns()
            name = rpc if rpc.startswith("urpc:") else GRPC_SERVICE_PATH + rpc
            self.tracer.record(name, end - int(seconds * 1e9), end, {"app_id": app_id, "status": status_name},
                               error=None if status_name == "SUCCESS" else status_name)

    def on_read_ahead(self, disk: str, kind: str, outcome: str, nbytes: int) -> None:
        """One read-ahead load ended (``DiskReadAhead.on_advised``)."""
        self.read_ahead.labels(disk, kind, outcome).inc()
        if outcome == "loaded":
            self.read_ahead_bytes.labels(disk, kind).inc(nbytes)

    def on_disk_throttle(self, disk: str, op: str, nbytes: int, wait_s: float) -> None:
        """One charge of a disk's throttle (called on its IO thread)."""
        self.disk_throttle_bytes.labels(disk, op).inc(nbytes)
        if wait_s > 0:
            self.disk_throttled_seconds.labels(disk, op).inc(wait_s)

    def on_recovered(self, *, seconds: float, apps: int, partitions: int, lost_blocks: int, removed: int,
                     remote_storage_refused: int = 0, foreign: int = 0) -> None:
        self.recovery_remote_storage_refused.inc(remote_storage_refused)
        self.recovery_foreign.inc(foreign)
        self.recovery_seconds.set(seconds)
        self.recovery_apps.set(apps)
        self.recovery_partitions.set(partitions)
        self.recovery_lost_blocks.inc(lost_blocks)
        self.recovery_removed.inc(removed)

    def on_scrub_checked(self, disk: str, nbytes: int, blocks: int, corrupt: int) -> None:
        self.scrub_bytes.labels(disk).inc(nbytes)
        self.scrub_blocks.labels(disk).inc(blocks)
        if corrupt:
            self.scrub_corrupt_blocks.labels(disk).inc(corrupt)

    def on_read_checked(self, disk: str, nbytes: int, blocks: int) -> None:
        if blocks:
            self.read_crc_checked_bytes.labels(disk).inc(nbytes)
            self.read_crc_checked_blocks.labels(disk).inc(blocks)

    def on_scrub_pass(self, disk: str) -> None:
        self.scrub_passes.labels(disk).inc()

    def on_tier_choice(self, tier: str, reason: str) -> None:
        self.spill_tier_choices.labels(tier, reason).inc()

    def render(self) -> bytes:
        return render_text(self.registry.collect(), self.registry)

    async def render_off_loop(self) -> bytes:
        """``render`` in the loop's default executor: the text of every series is Python work (8 ms
        idle, 50-130 ms seen on a loaded box), which on the loop held every RPC up. In a thread the loop
        gets the GIL back every switch interval (5 ms). The registry's metrics are thread-safe; the
        collectors read the ``snapshot``, whose fields the loop only ever replaces whole."""
        return await asyncio.get_running_loop().run_in_executor(None, self.render)
