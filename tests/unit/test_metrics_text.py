"""``metrics.render_text`` writes what ``prometheus_client.generate_latest`` writes, byte for byte.

Over a registry with every kind of family (counters with ``_created``, gauges, histograms, summaries,
info, enum, gauge histograms, untyped, timestamps), label values that need escaping, documentation
with backslashes and newlines, special float values; and over a shuffle server's own registry after
traffic. Names outside the legacy character set fall back to ``generate_latest``.
"""

from __future__ import annotations

import math

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    Summary,
    generate_latest,
)
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily, UnknownMetricFamily

from riffle_actors.metrics import Metrics, render_text
from tests.helpers.client import UniffleClient, make_blocks


class _Custom:
    def __init__(self, name: str = "custom_gauge", label: str = "path"):
        self.name, self.label = name, label

    def describe(self):
        return []

    def collect(self):
        g = GaugeMetricFamily(self.name, "a gauge\\with a backslash\nand a newline", labels=[self.label])
        g.add_metric(['quote " here'], 1.5, timestamp=1700000000.123)
        g.add_metric(["back\\slash\nnew line"], math.inf)
        g.add_metric(["ünïcode ✓"], -math.inf)
        g.add_metric(["nan"], math.nan)
        g.add_metric(["big"], 123456789.0)
        g.add_metric(["tiny"], 1e-9)
        yield g
        gh = GaugeHistogramMetricFamily("queue_sizes", "a gauge histogram", buckets=[("1.0", 4), ("+Inf", 5)],
                                        gsum_value=7)
        yield gh
        u = UnknownMetricFamily("mystery", "untyped", labels=["a"])
        u.add_metric(["x"], 3)
        yield u


def full_registry() -> CollectorRegistry:
    r = CollectorRegistry()
    c = Counter("requests", "requests served", ["rpc", "status"], registry=r)
    c.labels("sendShuffleData", "SUCCESS").inc(3)
    c.labels('odd"name', "a\\b").inc()
    Counter("plain_events", "no labels", registry=r).inc(2.5)
    g = Gauge("memory_bytes", "bytes", registry=r)
    g.set(1 << 40)
    h = Histogram("latency_seconds", "latency", ["rpc"], buckets=(0.001, 0.01, 1, 10), registry=r)
    for v in (0.0005, 0.02, 3, 100):
        h.labels("getShuffleResult").observe(v)
    Histogram("unlabelled_seconds", "no labels", registry=r).observe(0.3)
    s = Summary("sizes", "sizes", registry=r)
    s.observe(10)
    Info("build", "build info", registry=r).info({"version": "0.1.0", "commit": "abc"})
    Enum("state", "state", states=["up", "down"], registry=r).state("down")
    r.register(_Custom())
    return r


def test_every_kind_of_family_renders_as_generate_latest():
    r = full_registry()
    assert render_text(r.collect(), r) == generate_latest(r)


def test_a_name_outside_the_legacy_set_falls_back_to_generate_latest():
    r = full_registry()
    r.register(_Custom("name.with.dots"))
    r.register(_Custom("fine_name", label="läbel"))
    assert render_text(r.collect(), r) == generate_latest(r)


VOLATILE = ("process_", "riffle_server_event_loop_lag", "riffle_server_uptime")


def _stable(text: bytes) -> list[str]:
    """The lines of a page whose values cannot change between two scrapes in a row."""
    return [line for line in text.decode().splitlines() if not any(v in line for v in VOLATILE)]


@pytest.mark.asyncio
async def test_a_servers_page_renders_as_generate_latest(server):
    async with UniffleClient(f"127.0.0.1:{server.grpc_port}") as client:
        await client.register_shuffle("app_metrics_text", 0, range(4))
        await client.send_blocks("app_metrics_text", 0, make_blocks(1, 1, 3, 2000))
        await client.read_partition("app_metrics_text", 0, 1, None, check_complete=False)
    m: Metrics = server.metrics
    ours, theirs = _stable(m.render()), _stable(generate_latest(m.registry))
    assert len(ours) > 300 and ours == theirs
