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
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    TIME_SCALE,
    base_conf,
    client_jar,
    http_get,
    http_json,
    rss_conf,
    start_cluster,
    tail,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

JOB = Path(__file__).resolve().parent / "restart_job.py"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR")}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               PYTHONUNBUFFERED="1")
    return env


def _launch(run_dir: Path, conf: dict[str, str]) -> tuple[subprocess.Popen, Path, Path, Path]:
    run_dir.mkdir(parents=True)
    (run_dir / "local").mkdir()
    out, go, log = run_dir / "result.json", run_dir / "go", run_dir / "driver.log"
    spec = {"conf": {**base_conf(run_dir / "local"), **conf}, "out": str(out), "go": str(go),
            "wait_s": 600 * TIME_SCALE}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, str(JOB), "--spec", str(run_dir / "spec.json")], cwd=run_dir,
                                env=_env(), stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return proc, out, go, log


def _result(out: Path) -> dict:
    try:
        return json.loads(out.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _wait_phase(proc: subprocess.Popen, out: Path, log: Path, phase: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout * TIME_SCALE
    while True:
        res = _result(out)
        if "error" in res:
            raise AssertionError(f"driver failed:\n{res['error'][-4000:]}")
        if phase in res:
            return res[phase]
        if proc.poll() is not None:
            raise AssertionError(f"driver exited with {proc.returncode} before {phase}:\n{tail(log, 80)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {phase} within {timeout:.0f} s:\n{tail(log, 80)}")
        time.sleep(0.2)


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})?\s+([-+0-9.eE]+)$", line)
        if m and m.group(1) == name and all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
            total += float(m.group(3))
    return total


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
                   if _metric(http_get(s.http + "/metrics"), "riffle_server_rpc_total",
                              rpc="appHeartbeat", status="SUCCESS") < 1]
        if not waiting:
            return
        if proc.poll() is not None:
            raise AssertionError(f"driver exited with {proc.returncode}:\n{tail(log, 80)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no app heartbeat reached {waiting} within 60 s:\n{tail(log, 80)}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def test_second_action_reads_the_shuffle_again_after_a_server_restart(tmp_path: Path) -> None:
    jar = client_jar()
    assert jar is not None
    vanilla, v_out, v_go, v_log = _launch(tmp_path / "vanilla", {})
    v_go.touch()  # the oracle does not pause
    cluster = start_cluster(tmp_path / "cluster")
    rss = None
    try:
        rss, out, go, log = _launch(tmp_path / "rss", rss_conf(jar[1], cluster))
        first = _wait_phase(rss, out, log, "phase1", 400)
        assert first["rows"] > 0 and first["map_records"] > 0
        received = sum(_metric(http_get(s.http + "/metrics"), "riffle_server_received_bytes_total")
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

        second = _wait_phase(rss, out, log, "phase2", 400)
        assert rss.wait(120) == 0, tail(log, 80)
        assert second["digest"] == first["digest"] and second["rows"] == first["rows"]
        # read from the restarted servers (their counters started at zero)
        read = sum(_metric(http_get(s.http + "/metrics"), "riffle_server_read_bytes_total", source="localfile")
                   for s in cluster.servers)
        assert read > 0, "the second action did not read the shuffle from our servers"
        # no map stage recomputed: the accumulator did not move, and the map stage of the second job is skipped
        assert second["map_records"] == first["map_records"]
        stages = second["stages"]
        assert len(stages) >= 2, stages
        assert any(st["completed_tasks"] == 0 and st["num_tasks"] for st in stages), stages
        assert sum(st["completed_tasks"] or 0 for st in stages) == 16, stages  # the 16 reduce tasks only

        oracle = _wait_phase(vanilla, v_out, v_log, "phase2", 400)
        assert vanilla.wait(120) == 0, tail(v_log, 80)
        assert second["digest"] == oracle["digest"] and second["rows"] == oracle["rows"]
    finally:
        if rss is not None:
            _stop(rss)
        _stop(vanilla)
        cluster.stop()

