"""Coordinator quorum on five "hosts" (network namespaces): killing one coordinator of two disturbs
neither a running Spark job nor a new one (issue 11, item 5).

Topology (``tests/helpers/netlab.py``; everything removed at teardown, even on failure)::

    c1 10.232.0.10  riffle-coordinator        s1 10.232.0.11  riffle-server (quorum c1, c2)
    c2 10.232.0.13  riffle-coordinator        s2 10.232.0.12  riffle-server (quorum c1, c2)
    client 10.232.0.20  the Spark driver (local[2]) with spark.rss.coordinator.quorum = c1,c2

The client lists c1 first, so after c1 is SIGKILLed every coordinator call it makes tries the dead
one before c2. The job's map tasks wait at a gate (a file) until the test has killed c1, so the
kill lands while the job runs; the same application then runs a job over a shuffle registered after
the kill, and a new application starts while c1 is still dead. All answers equal their closed forms
(the job sums integers, so Spark's own shuffle is not needed as an oracle).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.helpers.netlab import NetLab, netns_problem

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

E2E_DIR = Path(__file__).resolve().parent
REPO = E2E_DIR.parents[1]
SUBNET = "10.232.0"
HOSTS = {"c1": f"{SUBNET}.10", "c2": f"{SUBNET}.13", "s1": f"{SUBNET}.11", "s2": f"{SUBNET}.12",
         "client": f"{SUBNET}.20"}
COORD_GRPC, COORD_HTTP = 21000, 21001
SERVER_GRPC, SERVER_HTTP = 19999, 20010
N = 200_000  # quorum_job.N

ENV = {k: v for k, v in os.environ.items() if k not in ("WORKER_IP", "SPARK_HOME", "PYSPARK_SUBMIT_ARGS")}
ENV["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")

GET = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode())"


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[NetLab]:
    reason = netns_problem()
    if reason:
        pytest.skip(reason)
    lab = NetLab(f"rfq{uuid.uuid4().hex[:6]}", tmp_path, HOSTS, bridge_ip=f"{SUBNET}.1", env=ENV)
    try:
        lab.build()
        yield lab
    finally:
        lab.teardown()


def ns_json(lab: NetLab, host: str, url: str):
    """GET ``url`` from inside ``host``'s namespace; None when it does not answer."""
    r = subprocess.run(["ip", "netns", "exec", lab.ns[host], "python3", "-c", GET, url], capture_output=True,
                       text=True, timeout=30, env=ENV)
    return json.loads(r.stdout) if r.returncode == 0 else None


def start_daemon(lab: NetLab, host: str, module: str, config: str, root: Path) -> subprocess.Popen:
    cfg = root / f"{host}.toml"
    cfg.write_text(config + f'[log]\npath = "{root / (host + ".log")}"\n')
    port_file = root / f"{host}.ports.json"
    proc = lab.popen(host, ["-m", module, "--config", str(cfg), "--port-file", str(port_file)])

    def ready() -> bool:
        assert proc.poll() is None, f"{host} exited with {proc.returncode}: {tail(root / (host + '.log'))}"
        return port_file.exists()

    wait_for(ready, 60, f"{host} listening")
    return proc


def tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else f"<{path} missing>"


def spark_conf(jar: Path, root: Path, name: str) -> dict[str, str]:
    local = root / f"spark-local-{name}"
    local.mkdir()
    ip = HOSTS["client"]
    return {
        "spark.master": "local[2]",
        "spark.ui.enabled": "false",
        "spark.driver.memory": "1g",
        "spark.driver.host": ip,
        "spark.driver.bindAddress": ip,
        "spark.local.dir": str(local),
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{E2E_DIR / 'log4j2.properties'}",
        "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
        "spark.shuffle.manager": "org.apache.spark.shuffle.RssShuffleManager",
        "spark.driver.extraClassPath": str(jar),
        "spark.executor.extraClassPath": str(jar),
        "spark.rss.coordinator.quorum": f"{HOSTS['c1']}:{COORD_GRPC},{HOSTS['c2']}:{COORD_GRPC}",
        "spark.rss.storage.type": "MEMORY_LOCALFILE",
        "spark.rss.client.type": "GRPC",
        "spark.rss.data.replica": "1",
        "spark.rss.data.replica.write": "1",
        "spark.rss.data.replica.read": "1",
        "spark.rss.client.assignment.shuffle.nodes.max": "2",
        "spark.rss.client.retry.max": "5",
        "spark.rss.client.retry.interval.max": "1000",
        "spark.rss.client.rpc.timeout.ms": "10000",
        "spark.rss.heartbeat.interval": "1000",
        "spark.rss.client.assignment.retry.times": "2",
        "spark.rss.client.assignment.retry.interval": "1000",
    }


def start_driver(lab: NetLab, root: Path, jar: Path, mode: str) -> tuple[subprocess.Popen, Path, Path]:
    conf = root / f"conf-{mode}.json"
    conf.write_text(json.dumps(spark_conf(jar, root, mode)))
    gate = root / f"gate-{mode}"
    gate.mkdir()
    out, log = root / f"result-{mode}.json", root / f"driver-{mode}.log"
    env = {**ENV, "SPARK_LOCAL_IP": HOSTS["client"], "PYSPARK_PYTHON": "python3", "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as f:
        proc = lab.popen("client", [str(E2E_DIR / "quorum_job.py"), "--conf", str(conf), "--gate", str(gate),
                                    "--out", str(out), "--mode", mode], env=env, stdout=f, stderr=subprocess.STDOUT)
    return proc, gate, out


def sums(key_mod: int, value) -> list[list[int]]:
    acc: dict[int, int] = {}
    for x in range(N):
        acc[x % key_mod] = acc.get(x % key_mod, 0) + value(x)
    return sorted([k, v] for k, v in acc.items())


def test_killing_one_coordinator_of_two_disturbs_neither_a_running_nor_a_new_job(
    lab: NetLab, tmp_path: Path, spark_runner
) -> None:
    jar = spark_runner.jar
    coords = {}
    for c in ("c1", "c2"):
        coords[c] = start_daemon(lab, c, "riffle_actors.coordinator", (
            f"grpc_port = {COORD_GRPC}\nhttp_port = {COORD_HTTP}\n[server]\nheartbeat_timeout_sec = 10\n"
            '[client_conf]\n"rss.storage.type" = "MEMORY_LOCALFILE"\n'), tmp_path)
    quorum = json.dumps([f"{HOSTS[c]}:{COORD_GRPC}" for c in ("c1", "c2")])
    for s in ("s1", "s2"):
        data = tmp_path / f"{s}-data"
        start_daemon(lab, s, "riffle_actors.server", (
            f"grpc_port = {SERVER_GRPC}\nhttp_port = {SERVER_HTTP}\ncoordinator_quorum = {quorum}\n"
            'heartbeat_interval_seconds = 1\ngrace_period_sec = 0\n[memory_store]\ncapacity = "64M"\n'
            f'[localfile_store]\ndata_paths = ["{data}"]\n'), tmp_path)
    server_ids = {f"{HOSTS[s]}-{SERVER_GRPC}" for s in ("s1", "s2")}

    def active_at(c: str) -> set[str]:
        listed = ns_json(lab, "client", f"http://{HOSTS[c]}:{COORD_HTTP}/api/servers") or []
        return {s["id"] for s in listed if s["status"] == "ACTIVE"}

    for c in ("c1", "c2"):
        wait_for(lambda c=c: active_at(c) == server_ids, 60, f"both servers ACTIVE at {c}")

    # 1. A job runs; its map tasks wait at the gate until c1 is dead.
    driver, gate, out = start_driver(lab, tmp_path, jar, "running")
    driver_log = tmp_path / "driver-running.log"

    def started() -> bool:
        assert driver.poll() is None, f"driver exited with {driver.returncode}:\n{tail(driver_log)}"
        return any(gate.glob("started-*"))

    wait_for(started, 180, "the job's map tasks running")
    app_id = json.loads(out.read_text())["app_id"]

    def known_to_both() -> bool:
        return all(any(app_id in a.get("app_id", "") for a in ns_json(lab, "client",
                       f"http://{HOSTS[c]}:{COORD_HTTP}/api/apps") or []) for c in ("c1", "c2"))

    wait_for(known_to_both, 60, "the app registered at both coordinators")
    coords["c1"].send_signal(signal.SIGKILL)
    coords["c1"].wait(10)
    (gate / "go").write_text("")
    assert driver.wait(300) == 0, tail(driver_log)
    result = json.loads(out.read_text())
    by97 = {k: v for k, v in sums(97, lambda x: x)}
    expect_running: dict[int, int] = {}
    for k, v in by97.items():
        expect_running[k % 7] = expect_running.get(k % 7, 0) + v
    assert result["running"] == sorted([k, v] for k, v in expect_running.items())
    assert result["after"] == sums(13, lambda x: 1)

    # 2. A new application while c1 is still dead.
    driver2, _, out2 = start_driver(lab, tmp_path, jar, "new")
    assert driver2.wait(300) == 0, tail(tmp_path / "driver-new.log")
    new = json.loads(out2.read_text())
    assert new["new"] == sums(11, lambda x: x)

    # c2 took over: it knows both applications, and both servers are still ACTIVE there.
    # (the client's app id is the Spark application id plus a suffix)
    apps_c2 = [a["app_id"] for a in ns_json(lab, "client", f"http://{HOSTS['c2']}:{COORD_HTTP}/api/apps") or []]
    assert any(new["app_id"] in a for a in apps_c2), apps_c2
    assert active_at("c2") == server_ids
