"""Riffle's README configs and launch lines, run through bash against a real ``riffle-server``.

The README's config snippets are kept as they are shown there in tests/integration/riffle_readme/;
each test changes only what cannot run on a test host (data paths, fixed ports -> 0, placeholder
hosts -> a closed local port, /var/log -> the test directory) and runs the README's launch line as
written, with ``./riffle-server`` a two-line wrapper starting this repo's server. A server is
ready when its log says ``listening: grpc_port=... http_port=...``; it is stopped with SIGTERM and
must exit 0.

- the README's ``WORKER_IP=... RUST_LOG=info WORKER_CONFIG_PATH=./config.toml ./riffle-server``
  with "All config options": HEALTHY on /health, Riffle's ``[log] path`` as a directory holding
  riffle-server.log, a WARNING for each not-yet key, the advertised ip from WORKER_IP;
- the benchmark's line (``GRPC_PARALLELISM=100 WORKER_IP=10.0.0.1 RUST_LOG=info ./riffle-server``)
  names no config: exit 2 asking for one; with ``WORKER_CONFIG_PATH`` and the benchmark config it
  serves, its thread pools mapped onto ours;
- ``./riffle-server -c FILE`` with the direct-IO, io_uring and Grafana snippets, ``RUST_LOG=riffle=debug``;
- bad launch variables exit 2 naming the variable;
- ``[health_service_config]``, ``launch_purge_enable`` and ``fallback_random_ports_enable`` in effect.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg
from tests.helpers import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
README = Path(__file__).resolve().parent / "riffle_readme"
ENV = {k: v for k, v in os.environ.items()
       if k not in ("RUST_LOG", "WORKER_IP", "WORKER_CONFIG_PATH", "GRPC_PARALLELISM", "URPC_PARALLELISM")}
ENV["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
LISTENING = re.compile(r"listening: grpc_port=(\d+) http_port=(\d+)")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary(tmp_path: Path) -> None:
    """``./riffle-server``: this repo's server, as the installed entry point would start it."""
    exe = tmp_path / "riffle-server"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m riffle_actors.server "$@"\n')
    exe.chmod(0o755)


def _local(text: str, tmp_path: Path, disks: int) -> str:
    """A README config made runnable here: only hosts, ports, paths change."""
    closed = _closed_port()
    paths = ", ".join(f'"{tmp_path / f"disk{i}"}"' for i in range(disks))
    text = re.sub(r"data_paths = \[[^\]]*\]", f"data_paths = [{paths}]", text)
    text = re.sub(r"^(grpc_port|http_port|urpc_port) = \d+$", r"\1 = 0", text, flags=re.MULTILINE)
    text = re.sub(r"coordinator_quorum = \[[^\]]*\]", f'coordinator_quorum = ["127.0.0.1:{closed}"]', text)
    text = re.sub(r'push_gateway_endpoint = "[^"]*"', f'push_gateway_endpoint = "http://127.0.0.1:{closed}"', text)
    text = re.sub(r'jaeger_reporter_endpoint = "[^"]*"', f'jaeger_reporter_endpoint = "http://127.0.0.1:{closed}"',
                  text)
    if 'keytab_path = "' in text:  # a keytab file of the server's user, chmod 600 (checked at start)
        keytab = tmp_path / "riffle.keytab"
        keytab.write_bytes(b"\x05\x02")
        keytab.chmod(0o600)
        text = re.sub(r'keytab_path = "[^"]*"', f'keytab_path = "{keytab}"', text)
    return text.replace('path = "/var/log/my_service.log"', 'path = "logs/"')


class Launched:
    def __init__(self, tmp_path: Path, line: str, *, log: Path | None = None):
        self.tmp_path = tmp_path
        self.stderr_path = tmp_path / "stderr.txt"
        self.log = log or self.stderr_path
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(["bash", "-c", line], cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL,
                                         stderr=err, start_new_session=True)
        self.grpc_port = self.http_port = 0

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_ready(self) -> Launched:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}:\n{self.stderr_path.read_text()[-3000:]}")
            return LISTENING.search(self.text())

        m = wait_for(ready, 90, "the server's listening line")
        self.grpc_port, self.http_port = int(m.group(1)), int(m.group(2))
        return self

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/health", timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
            raise


def _run(tmp_path: Path, line: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", line], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=60,
                          check=False)


def test_readme_launch_line_with_all_config_options(tmp_path: Path):
    _binary(tmp_path)
    (tmp_path / "config.toml").write_text(_local((README / "all_options.toml").read_text(), tmp_path, 2))
    server = Launched(tmp_path, "WORKER_IP=10.0.0.1 RUST_LOG=info WORKER_CONFIG_PATH=./config.toml ./riffle-server",
                      log=tmp_path / "logs" / "riffle-server.log")  # Riffle's [log] path is a directory
    try:
        server.wait_ready()
        status, body = server.health()
        assert (status, body["status"]) == (200, "HEALTHY"), body
        log = server.text()
        assert "not yet implemented here" not in log  # its Kerberos and tracing tables are built here
        assert re.search(r"tracing: spans of service my_service-10\.0\.0\.1-\d+-\d+ to http://127\.0\.0\.1:\d+/v1/"
                         r"traces", log)
        assert "memory_store.dashmap_shard_amount = 128: no effect here" in log
        assert "runtime_config.hdfs_write_thread_num = 20: caps hdfs_store.max_concurrency" in log
        assert re.search(r"server id 10\.0\.0\.1-\d+-\d+ \(advertised ip 10\.0\.0\.1, from WORKER_IP\)", log)
        assert "| DEBUG" not in log  # RUST_LOG=info
    finally:
        assert server.stop() == 0, server.stderr_path.read_text()[-3000:]


def test_benchmark_launch_line(tmp_path: Path):
    _binary(tmp_path)
    line = "GRPC_PARALLELISM=100 WORKER_IP=10.0.0.1 RUST_LOG=info ./riffle-server"
    bare = _run(tmp_path, line)  # as in the README: no config named anywhere
    assert bare.returncode == 2
    assert "no config file: pass -c/--config PATH or set WORKER_CONFIG_PATH" in bare.stderr
    (tmp_path / "bench.toml").write_text(_local((README / "benchmark.toml").read_text(), tmp_path, 4))
    server = Launched(tmp_path, f"WORKER_CONFIG_PATH=bench.toml {line}")
    try:
        server.wait_ready()
        assert server.health()[0] == 200
        log = server.text()
        assert "GRPC_PARALLELISM=100: no effect here" in log
        assert "localfile_store.write_concurrency_per_disk = 4" in log
        assert "now localfile_store.disk_read_threads = 10" in log  # read_thread_num = 40 over 4 disks
        assert "runtime_config.http_thread_num = 10: no effect here" in log
    finally:
        assert server.stop() == 0, server.text()[-3000:]


def test_dash_c_with_the_readme_snippets(tmp_path: Path):
    _binary(tmp_path)
    snippets = "\n".join((README / name).read_text()
                         for name in ("direct_io.toml", "io_uring.toml", "grafana_metrics.toml"))
    (tmp_path / "s.toml").write_text("store_type = \"MEMORY_LOCALFILE\"\ngrpc_port = 0\nhttp_port = 0\n"
                                     + _local(snippets, tmp_path, 1))
    server = Launched(tmp_path, "RUST_LOG=riffle=debug ./riffle-server -c s.toml")
    try:
        server.wait_ready()
        assert server.health()[0] == 200
        log = server.text()
        assert "localfile_store.direct_io_enable = True: sets direct_io_append_enable" in log
        assert "localfile_store.io_uring_options set: no effect here" in log
        assert "direct_io_read_enable" not in log  # false: what this server does anyway
        assert "| DEBUG" in log  # RUST_LOG=riffle=debug
    finally:
        assert server.stop() == 0, server.text()[-3000:]


@pytest.mark.parametrize(("env", "named"), [("WORKER_IP=host-a", "WORKER_IP (environment)"),
                                            ("GRPC_PARALLELISM=many", "GRPC_PARALLELISM (environment)")])
def test_unusable_launch_variables_exit_2(tmp_path: Path, env: str, named: str):
    _binary(tmp_path)
    (tmp_path / "config.toml").write_text(_local("[localfile_store]\ndata_paths = []\n", tmp_path, 1))
    result = _run(tmp_path, f"{env} WORKER_CONFIG_PATH=./config.toml ./riffle-server")
    assert result.returncode == 2, result.stderr
    assert named in result.stderr


def test_health_service_config_launch_purge_and_port_fallback(tmp_path: Path):
    _binary(tmp_path)
    disk = tmp_path / "disk0"
    (disk / "old-app" / "0").mkdir(parents=True)
    (disk / "old-app" / "0" / "partition-0.data").write_bytes(b"x" * 100)
    outside = tmp_path / "keep.txt"
    outside.write_text("not under a data path")
    (disk / "link").symlink_to(outside)
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    (tmp_path / "c.toml").write_text(f"""grpc_port = 0
http_port = {taken}
fallback_random_ports_enable = true
[localfile_store]
data_paths = ["{disk}"]
launch_purge_enable = true
[health_service_config]
alive_app_number_max_limit = 0
""")
    server = Launched(tmp_path, "./riffle-server --config c.toml")
    try:
        server.wait_ready()
        assert server.http_port != taken
        assert f"http_port {taken} is in use: taking a free port instead" in server.text()
        assert not (disk / "old-app").exists()  # purged, not recovered
        assert not (disk / "link").exists() and outside.read_text() == "not under a data path"
        assert server.health()[0] == 200
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            reply = pbg.ShuffleServerStub(channel).registerShuffle(pb.ShuffleRegisterRequest(
                appId="app-1", shuffleId=0, partitionRanges=[pb.ShufflePartitionRange(start=0, end=0)]))
            assert reply.status == 0
        status, body = server.health()
        assert (status, body["status"]) == (503, "UNHEALTHY")
        assert "1 apps registered, more than health_service_config.alive_app_number_max_limit=0" in body["reasons"]
    finally:
        busy.close()
        assert server.stop() == 0, server.text()[-3000:]


def test_disk_used_ratio_health_threshold(tmp_path: Path):
    _binary(tmp_path)
    (tmp_path / "c.toml").write_text(f"""grpc_port = 0
http_port = 0
[localfile_store]
data_paths = ["{tmp_path / 'disk0'}"]
[health_service_config]
disk_used_ratio_health_threshold = 0.000001
""")
    server = Launched(tmp_path, "./riffle-server -c c.toml")
    try:
        server.wait_ready()
        status, body = server.health()
        assert status == 503
        assert any("above health_service_config.disk_used_ratio_health_threshold=1e-06" in r
                   for r in body["reasons"]), body["reasons"]
    finally:
        assert server.stop() == 0, server.text()[-3000:]
