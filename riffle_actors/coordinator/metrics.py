"""The coordinator's Prometheus metrics, in a registry of its own (no module globals).

Everything is *pulled*: ``/metrics`` fills a ``CoordinatorSnapshot`` from the service (server
views, app counts, counters) and the collector turns it into gauges and counters, so nothing
polls in the background. Names follow ``riffle_coordinator_<thing>_<unit>``; labels are a small
fixed set (``status``, ``kind``, ``rpc``), never a server or app id:

| metric | type | what |
|---|---|---|
| ``riffle_coordinator_servers{status}`` | gauge | registered servers by effective status (every status listed, 0 included) |
| ``riffle_coordinator_servers_lost_total`` | counter | servers dropped after ``heartbeat_timeout_sec`` of silence |
| ``riffle_coordinator_heartbeat_lag_seconds`` | gauge | oldest last heartbeat among registered servers (seconds ago) |
| ``riffle_coordinator_heartbeat_age_seconds`` | histogram | registered servers by seconds since their last heartbeat |
| ``riffle_coordinator_heartbeats_refused_total{kind}`` | counter | refused heartbeats by reason |
| ``riffle_coordinator_assignments_total`` | counter | getShuffleAssignments answered with servers |
| ``riffle_coordinator_assignment_failures_total`` | counter | assignments refused (too few candidates) |
| ``riffle_coordinator_assigned_partitions_total`` | counter | partition replicas assigned |
| ``riffle_coordinator_apps`` | gauge | live applications |
| ``riffle_coordinator_historical_apps`` | gauge | expired applications kept in the history |
| ``riffle_coordinator_apps_registered_total`` / ``_apps_expired_total`` | counter | apps seen / expired since start |
| ``riffle_coordinator_rpc_total{rpc}`` | counter | gRPC calls by method |
| ``riffle_coordinator_uptime_seconds`` | gauge | seconds since start |

``CoordinatorCounters`` holds the counters the use cases bump (refusals, assignments) and the
gRPC adapter's calls by method (``on_rpc``, the recorder of ``transport.rpc_answer``): the service
layer writes them, ``coordinator.admin`` reads them into the snapshot and ``/api/health``.

It does not cover: collecting the figures (``coordinator.admin.CoordinatorAdmin.refresh_metrics``
asks the actors) or the push to a Pushgateway (``riffle_actors.metrics_push``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

#: Upper bounds (seconds) of the heartbeat-lag buckets.
LAG_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)


@dataclass(slots=True)
class CoordinatorCounters:
    """What the coordinator counted since start (written by the service layer and the gRPC adapter)."""

    heartbeats_refused: Counter[str] = field(default_factory=Counter)  # refused server heartbeats, by kind
    requests_refused: Counter[str] = field(default_factory=Counter)  # refused driver requests, by kind
    assignments_total: int = 0
    assignment_failures_total: int = 0
    assigned_partitions_total: int = 0
    rpc_calls: Counter[str] = field(default_factory=Counter)  # gRPC calls by method

    def on_rpc(self, rpc: str, status_name: str, started: float, app_id: str = "") -> None:
        """One answered gRPC call (``transport.rpc_answer``'s recorder): counted by method."""
        self.rpc_calls[rpc] += 1


@dataclass
class CoordinatorSnapshot:
    """What the collector reads; refreshed by ``coordinator.admin`` before each scrape or push."""

    servers_by_status: dict[str, int] = field(default_factory=dict)  # every status named, 0 included
    heartbeat_ages_s: list[float] = field(default_factory=list)
    servers_lost_total: int = 0
    heartbeats_refused: dict[str, int] = field(default_factory=dict)
    assignments_total: int = 0
    assignment_failures_total: int = 0
    assigned_partitions_total: int = 0
    apps: int = 0
    historical_apps: int = 0
    apps_registered_total: int = 0
    apps_expired_total: int = 0
    rpc_calls: dict[str, int] = field(default_factory=dict)
    uptime_s: float = 0.0


class _Collector:
    def __init__(self, metrics: CoordinatorMetrics):
        self.metrics = metrics

    def collect(self):
        s = self.metrics.snapshot
        servers = GaugeMetricFamily("riffle_coordinator_servers", "registered servers by effective status",
                                    labels=["status"])
        for status, count in s.servers_by_status.items():
            servers.add_metric([status], count)
        yield servers
        yield CounterMetricFamily("riffle_coordinator_servers_lost", "servers dropped after heartbeat_timeout_sec "
                                  "of silence", value=s.servers_lost_total)
        yield GaugeMetricFamily("riffle_coordinator_heartbeat_lag_seconds", "seconds since the oldest last "
                                "heartbeat among registered servers (0 without servers)",
                                value=max(s.heartbeat_ages_s, default=0.0))
        buckets = [(str(b), sum(1 for a in s.heartbeat_ages_s if a <= b)) for b in LAG_BUCKETS]
        buckets.append(("+Inf", len(s.heartbeat_ages_s)))
        yield HistogramMetricFamily("riffle_coordinator_heartbeat_age_seconds", "registered servers by seconds "
                                    "since their last heartbeat", buckets=buckets,
                                    sum_value=sum(s.heartbeat_ages_s))
        refused = CounterMetricFamily("riffle_coordinator_heartbeats_refused", "refused heartbeats by reason",
                                      labels=["kind"])
        for kind in ("invalid", "source_not_allowed", "id_conflict", "registry_full", "host_limit"):
            refused.add_metric([kind], s.heartbeats_refused.get(kind, 0))
        yield refused
        for name, value, doc in (
            ("riffle_coordinator_assignments", s.assignments_total, "getShuffleAssignments answered with servers"),
            ("riffle_coordinator_assignment_failures", s.assignment_failures_total,
             "assignments refused: too few candidate servers"),
            ("riffle_coordinator_assigned_partitions", s.assigned_partitions_total, "partition replicas assigned"),
            ("riffle_coordinator_apps_registered", s.apps_registered_total, "applications seen since start"),
            ("riffle_coordinator_apps_expired", s.apps_expired_total, "applications expired since start"),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        yield GaugeMetricFamily("riffle_coordinator_apps", "live applications", value=s.apps)
        yield GaugeMetricFamily("riffle_coordinator_historical_apps", "expired applications kept in the history",
                                value=s.historical_apps)
        rpc = CounterMetricFamily("riffle_coordinator_rpc", "gRPC calls by method", labels=["rpc"])
        for name, count in sorted(s.rpc_calls.items()):
            rpc.add_metric([name], count)
        yield rpc
        yield GaugeMetricFamily("riffle_coordinator_uptime_seconds", "seconds since the coordinator started",
                                value=s.uptime_s)


class CoordinatorMetrics:
    """The coordinator's registry, the snapshot its collector reads and the counters behind it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.snapshot = CoordinatorSnapshot()
        self.counters = CoordinatorCounters()
        self.registry.register(_Collector(self))

    def render(self) -> bytes:
        return generate_latest(self.registry)
