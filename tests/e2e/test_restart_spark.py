"""A Spark job survives a restart of every shuffle server between two actions over the same shuffle.

One coordinator and two riffle-server daemons of its own (the session cluster is shared and must not be
restarted). The driver (tests/e2e/restart_job.py) collects a reduceByKey over a mapped RDD on
RssShuffleManager (map and reduce stages run), then pauses; both servers are stopped with SIGTERM and started
again on the same ports and data paths; the driver collects the same RDD again. The second answer must equal
the first and Spark's own sort shuffle's (a vanilla run of the same driver), come from our restarted servers
(their local-file reads grew from zero), and the map stage must not have run again: the map function's
accumulator is unchanged and Spark's status tracker shows the map stage of the second job with no completed
task (skipped).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    TIME_SCALE,
    client_jar,
    http_get,
    http_json,
    rss_conf,
    start_cluster,
    tail,
)
from tests.e2e.two_actions import assert_reread_exactly, launch, metric, stop_driver, wait_phase

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


def _restart_server(server) -> None:
    """SIGTERM (exit 0, memory flushed), then start again with the same ports and data path."""
    ports = json.loads((server.workdir / "ports.json").read_text())
    server.proc.terminate()  # SIGTERM to the daemon itself
    assert server.proc.wait(60) == 0, tail(server.log_path)
    text = server.config.read_text()
    for key in ("grpc_port", "urpc_port", "http_port"):
        text = re.sub(rf"^{key} = \d+$", f"{key} = {ports[key]}", text, flags=re.MULTILINE)
    server.config.write_text(text)
    server.start()
    assert (server.grpc_port, server.http_port) == (ports["grpc_port"], ports["http_port"])


def _wait_app_heartbeats(servers, proc: subprocess.Popen, log: Path) -> None:
    """Until each (restarted) server has answered the driver's appHeartbeat with SUCCESS."""
    deadline = time.monotonic() + 60 * TIME_SCALE
    while True:
        waiting = [s.http for s in servers
                   if metric(http_get(s.http + "/metrics"), "riffle_server_rpc_total",
                              rpc="appHeartbeat", status="SUCCESS") < 1]
        if not waiting:
            return
        if proc.poll() is not None:
            raise AssertionError(f"driver exited with {proc.returncode}:\n{tail(log, 80)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no app heartbeat reached {waiting} within 60 s:\n{tail(log, 80)}")
        time.sleep(0.2)


def test_second_action_reads_the_shuffle_again_after_a_server_restart(tmp_path: Path) -> None:
    jar = client_jar()
    assert jar is not None
    vanilla, v_out, v_go, v_log = launch(tmp_path / "vanilla", {})
    v_go.touch()  # the oracle does not pause
    cluster = start_cluster(tmp_path / "cluster")
    rss = None
    try:
        rss, out, go, log = launch(tmp_path / "rss", rss_conf(jar[1], cluster))
        first = wait_phase(rss, out, log, "phase1", 400)
        assert first["rows"] > 0 and first["map_records"] > 0
        received = sum(metric(http_get(s.http + "/metrics"), "riffle_server_received_bytes_total")
                       for s in cluster.servers)
        assert received > 0, "the shuffle did not go through our servers"

        for server in cluster.servers:
            _restart_server(server)
        cluster.wait_servers_active()
        recovered = [a for s in cluster.servers for a in http_json(s.http + "/apps")]
        assert recovered and all(a["recovered"] and a["lost_blocks"] == 0 for a in recovered), recovered
        for s in cluster.servers:
            assert "recovery took" in s.log_path.read_text()
        # the driver's gRPC channel to a restarted server may still be in its reconnect backoff (the
        # heartbeat it sent while the server was down failed): the 0.9.2 client does not retry
        # getShuffleResult, so the second action starts once every server has answered an app heartbeat
        _wait_app_heartbeats(cluster.servers, rss, log)
        go.touch()

        second = wait_phase(rss, out, log, "phase2", 400)
        assert rss.wait(120) == 0, tail(log, 80)
        # read from the restarted servers (their counters started at zero)
        read = sum(metric(http_get(s.http + "/metrics"), "riffle_server_read_bytes_total", source="localfile")
                   for s in cluster.servers)
        assert read > 0, "the second action did not read the shuffle from our servers"
        assert_reread_exactly(first, second, (vanilla, v_out, v_log))
    finally:
        if rss is not None:
            stop_driver(rss)
        stop_driver(vanilla)
        cluster.stop()

