"""Metrics of both daemons, scraped from real processes: the coordinator's own metrics, the Grafana
dashboard in ``deploy/grafana`` (every panel queries a metric the daemons export), and the optional
push to a real Prometheus Pushgateway (Debian's ``prometheus-pushgateway``)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from riffle_actors.config import ConfigError, load_config
from riffle_actors.coordinator.config import load_coordinator_config
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pb_grpc
from tests.ctl.cluster import REPO, RealCluster, http_json, send_blocks
from tests.helpers import parse_metrics, wait_for

pytestmark = pytest.mark.integration

DASHBOARD = REPO / "deploy" / "grafana" / "riffle-dashboard.json"


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """sample name -> [(labels, value)] of a /metrics page."""
    with urllib.request.urlopen(url, timeout=10) as r:
        return parse_metrics(r.read().decode())


def value(samples: dict, name: str, **labels: str) -> float:
    return next(v for lab, v in samples[name] if all(lab.get(k) == w for k, w in labels.items()))


def _assign(cluster: RealCluster, app_id: str, partitions: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{cluster.coordinator.ports['grpc_port']}") as channel:
        resp = pb_grpc.CoordinatorServerStub(channel).getShuffleAssignments(pb.GetShuffleServerRequest(
            applicationId=app_id, shuffleId=0, partitionNum=partitions, partitionNumPerRange=1, dataReplica=1,
            requireTags=["ss_v5"]))
        assert resp.status == 0, resp.retMsg


def test_coordinator_metrics(cluster: RealCluster) -> None:
    url = cluster.url + "/metrics"
    def counted() -> dict | None:
        s = scrape(url)
        return s if value(s, "riffle_coordinator_servers", status="UNHEALTHY") == 1 else None

    m = wait_for(counted, timeout=30, what="the sick server counted UNHEALTHY")
    assert value(m, "riffle_coordinator_servers", status="ACTIVE") == 1
    assert value(m, "riffle_coordinator_servers", status="LOST") == 0
    assert value(m, "riffle_coordinator_heartbeat_age_seconds_count") == 2
    # the lag is bounded by causality: once every server was heard after t0, the oldest last
    # heartbeat is younger than the time since t0 (both daemons and the test read CLOCK_MONOTONIC)
    t0 = time.monotonic()
    seen = {s["id"]: s["last_heartbeat_ms"] for s in http_json(cluster.url + "/api/servers")}
    assert len(seen) == 2
    wait_for(lambda: all(s["last_heartbeat_ms"] > seen[s["id"]] for s in http_json(cluster.url + "/api/servers")),
             timeout=30, what="a new heartbeat from every server")
    m = scrape(url)
    since_t0 = time.monotonic() - t0
    lag = value(m, "riffle_coordinator_heartbeat_lag_seconds")
    assert 0 <= lag <= since_t0, (lag, since_t0)
    assert lag <= value(m, "riffle_coordinator_heartbeat_age_seconds_sum")  # the oldest of the two ages
    before = value(m, "riffle_coordinator_assignments_total"), value(m, "riffle_coordinator_assigned_partitions_total")
    _assign(cluster, "app-metrics", 6)
    after = scrape(url)
    assert value(after, "riffle_coordinator_assignments_total") == before[0] + 1
    assert value(after, "riffle_coordinator_assigned_partitions_total") == before[1] + 6
    assert value(after, "riffle_coordinator_apps") >= 1
    assert value(after, "riffle_coordinator_rpc_total", rpc="getShuffleAssignments") >= 1
    assert value(after, "riffle_coordinator_heartbeats_refused_total", kind="id_conflict") == 0


def test_every_dashboard_panel_queries_an_exported_metric(cluster: RealCluster) -> None:
    healthy = next(s for s in cluster.servers if "healthy" in s.log.name)
    send_blocks(healthy.ports["grpc_port"], "app-dashboard", [b"x" * 1000])  # rpc metrics have samples now
    _assign(cluster, "app-dashboard", 2)
    exported: set[str] = set(scrape(cluster.url + "/metrics"))
    for server in cluster.servers:
        exported |= set(scrape(f"http://127.0.0.1:{server.ports['http_port']}/metrics"))
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["panels"], "the dashboard has no panel"
    used: set[str] = set()
    for panel in dashboard["panels"]:
        exprs = [t["expr"] for t in panel.get("targets", [])]
        assert exprs, f"panel {panel['title']!r} has no query"
        for expr in exprs:
            names = set(re.findall(r"\briffle_[a-z0-9_]+", expr))
            assert names, f"panel {panel['title']!r}: {expr!r} names no riffle metric"
            missing = names - exported
            assert not missing, f"panel {panel['title']!r} queries {sorted(missing)}, which no daemon exports"
            used |= names
    assert any(n.startswith("riffle_coordinator_") for n in used) and any(n.startswith("riffle_memory") for n in used)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def pushgateway(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
    if binary is None:
        pytest.skip("prometheus-pushgateway is not installed (scripts/e2e_setup.sh installs it)")
    for _ in range(5):  # the gateway cannot bind port 0 and report it: pick a free one, retry on a race
        port = _free_port()
        proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"

        def up(proc: subprocess.Popen = proc, url: str = url) -> bool:
            if proc.poll() is not None:
                return True
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(up, timeout=30, what="pushgateway ready")
        if proc.poll() is None:
            break
    else:
        pytest.fail("the pushgateway did not start on any of 5 free ports")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_both_daemons_push_to_a_pushgateway(pushgateway: str, tmp_path: Path) -> None:
    c = RealCluster(tmp_path)
    metrics = f'[metrics]\npush_gateway_endpoint = "{pushgateway}"\npush_interval_sec = 1\nlabels = {{ cluster = "ci" }}\n'
    try:
        c.start_coordinator(tables=metrics)
        server = c.start_server("pushing", tables=metrics)
        c.wait_registered(1)
        sid = f"127.0.0.1-{server.ports['grpc_port']}"

        def pushed():
            m = scrape(pushgateway + "/metrics")
            coord = [lab for lab, v in m.get("riffle_coordinator_servers", [])
                     if lab.get("job") == "riffle-coordinator" and lab.get("status") == "ACTIVE" and v == 1]
            worker = [lab for lab, v in m.get("riffle_memory_capacity_bytes", [])
                      if lab.get("job") == "uniffle-worker" and lab.get("worker_id") == sid and v == 64 << 20]
            return (coord and worker) and (coord[0], worker[0])

        coord, worker = wait_for(pushed, timeout=30, what="both daemons' metrics on the pushgateway")
        assert coord["cluster"] == "ci" and worker["cluster"] == "ci" and worker["version"]
    finally:
        c.stop()


def test_metrics_section_rejects_unknown_keys_and_bad_values(tmp_path: Path) -> None:
    server = tmp_path / "server.toml"
    server.write_text(f'[localfile_store]\ndata_paths = ["{tmp_path}"]\n[metrics]\npush_gateway = "http://x:9091"\n')
    with pytest.raises(ConfigError, match=r"metrics\.push_gateway: unknown key"):
        load_config(server)
    coord = tmp_path / "coordinator.toml"
    coord.write_text('[metrics]\npush_gateway_endpoint = "pushgateway:9091"\n')
    with pytest.raises(ConfigError, match=r"metrics\.push_gateway_endpoint: .*not an http"):
        load_coordinator_config(coord)
    coord.write_text('[metrics]\npush_gateway_endpoint = "http://pg:9091"\npush_interval_sec = 5\n'
                     'labels = { "bad-name" = "x" }\n')
    with pytest.raises(ConfigError, match=r"metrics\.labels"):
        load_coordinator_config(coord)
