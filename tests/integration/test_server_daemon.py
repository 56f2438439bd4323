"""The ``riffle-server`` binary: config errors exit 2 naming the key, SIGTERM flushes memory and exits 0,
``--daemon`` / ``status`` / ``stop`` work, and ``/apps`` reports memory and disk bytes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
import zlib
from pathlib import Path

import grpc
import pytest

from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg
from tests.helpers import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
CMD = [sys.executable, "-m", "riffle_actors.server"]


def write_config(tmp_path: Path, extra: str = "") -> Path:
    cfg = tmp_path / "server.toml"
    cfg.write_text(f"""grpc_port = 0
http_port = 0
grace_period_sec = 20
{extra}
[memory_store]
capacity = "64M"
[localfile_store]
data_paths = ["{tmp_path / 'data'}"]
[log]
path = "{tmp_path / 'server.log'}"
""")
    return cfg


def read_ports(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def http_json(port: int, path: str):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.loads(r.read())


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    cfg = write_config(tmp_path).read_text().replace('capacity = "64M"', 'capacty = "64M"')
    (tmp_path / "bad.toml").write_text(cfg)
    result = subprocess.run([*CMD, "--config", str(tmp_path / "bad.toml")], env=ENV, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert "memory_store.capacty: unknown key" in result.stderr


def test_sigterm_flushes_memory_to_disk_and_exits_0(tmp_path: Path) -> None:
    port_file = tmp_path / "ports.json"
    proc = subprocess.Popen([*CMD, "--config", str(write_config(tmp_path)), "--port-file", str(port_file)],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ports = wait_for(lambda: read_ports(port_file), 60, "port file")
        data = os.urandom(100_000)
        with grpc.insecure_channel(f"127.0.0.1:{ports['grpc_port']}") as channel:
            stub = pbg.ShuffleServerStub(channel)
            assert stub.registerShuffle(pb.ShuffleRegisterRequest(
                appId="app-term", shuffleId=0, partitionRanges=[pb.ShufflePartitionRange(start=0, end=0)])).status == 0
            ticket = stub.requireBuffer(pb.RequireBufferRequest(requireSize=len(data) + 32, appId="app-term"))
            assert ticket.status == 0
            sent = stub.sendShuffleData(pb.SendShuffleDataRequest(
                appId="app-term", shuffleId=0, requireBufferId=ticket.requireBufferId,
                shuffleData=[pb.ShuffleData(partitionId=0, block=[pb.ShuffleBlock(
                    blockId=1, length=len(data), uncompressLength=len(data), crc=zlib.crc32(data), data=data,
                    taskAttemptId=0)])]))
            assert sent.status == 0
        apps = http_json(ports["http_port"], "/apps")
        assert apps[0]["app_id"] == "app-term" and apps[0]["memory_bytes"] == len(data) + 32
        assert apps[0]["disk_bytes"] == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        data_files = list((tmp_path / "data").rglob("*.data"))
        assert [f.read_bytes() for f in data_files] == [data], "memory was not flushed on SIGTERM"
        assert "flushed memory to disk before exit" in (tmp_path / "server.log").read_text()
        assert not port_file.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_daemon_status_and_stop(tmp_path: Path) -> None:
    pid_file = tmp_path / "server.pid"
    cfg = write_config(tmp_path)
    started = subprocess.run([*CMD, "--config", str(cfg), "--daemon", "--pid-file", str(pid_file)], env=ENV,
                             capture_output=True, text=True, timeout=90)
    pid = int(pid_file.read_text()) if pid_file.exists() else None
    try:
        assert started.returncode == 0, started.stderr
        status = subprocess.run([*CMD, "status", "--pid-file", str(pid_file)], env=ENV, capture_output=True,
                                text=True, timeout=30)
        assert status.returncode == 0 and str(pid) in status.stdout
        stop = subprocess.run([*CMD, "stop", "--pid-file", str(pid_file)], env=ENV, capture_output=True, text=True,
                              timeout=90)
        assert stop.returncode == 0, stop.stderr
        status = subprocess.run([*CMD, "status", "--pid-file", str(pid_file)], env=ENV, capture_output=True,
                                text=True, timeout=30)
        assert status.returncode == 3
    finally:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
