"""A real cluster for riffle-ctl tests: one coordinator and shuffle servers as separate processes.

``RealCluster.start(tmp)`` launches ``python -m riffle_actors.coordinator`` and each server
(``python -m riffle_actors.server``) on port 0 with ``--port-file``, waits (on conditions) until
every server is registered, and ``stop()`` terminates every process it started (SIGTERM, then
SIGKILL after a bounded wait). ``ctl(...)`` runs ``python -m riffle_actors.ctl`` against it, and
``shell(...)`` runs a shell pipeline of ctl commands (``$CTL`` in the command line).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "ctl-test-admin-token-0123456789"
BASE_ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
BASE_ENV.pop("RIFFLE_ADMIN_TOKEN", None)
BASE_ENV.pop("RIFFLE_COORDINATOR", None)
CTL = [sys.executable, "-m", "riffle_actors.ctl"]


def _ports(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def http_json(url: str, method: str = "GET", body: Any = None, token: str | None = None) -> Any:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def send_blocks(grpc_port: int, app_id: str, blocks: list[bytes]) -> None:
    """Register app ``app_id`` shuffle 0 on a server and send ``blocks`` to partition 0 (real crc32s)."""
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = pbg.ShuffleServerStub(channel)
        assert stub.registerShuffle(pb.ShuffleRegisterRequest(
            appId=app_id, shuffleId=0, partitionRanges=[pb.ShufflePartitionRange(start=0, end=0)])).status == 0
        ticket = stub.requireBuffer(pb.RequireBufferRequest(requireSize=sum(len(b) + 32 for b in blocks),
                                                            appId=app_id))
        assert ticket.status == 0
        sent = stub.sendShuffleData(pb.SendShuffleDataRequest(
            appId=app_id, shuffleId=0, requireBufferId=ticket.requireBufferId,
            shuffleData=[pb.ShuffleData(partitionId=0, block=[
                pb.ShuffleBlock(blockId=100 + i, length=len(b), uncompressLength=len(b), crc=zlib.crc32(b), data=b,
                                taskAttemptId=7) for i, b in enumerate(blocks)])]))
        assert sent.status == 0


@dataclass
class Daemon:
    proc: subprocess.Popen
    ports: dict[str, Any]
    log: Path


@dataclass
class RealCluster:
    tmp: Path
    coordinator: Daemon | None = None
    servers: list[Daemon] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self.coordinator is not None
        return f"http://127.0.0.1:{self.coordinator.ports['http_port']}"

    @property
    def server_ids(self) -> list[str]:
        return sorted(f"127.0.0.1-{s.ports['grpc_port']}" for s in self.servers)

    def env(self, **extra: str) -> dict[str, str]:
        return {**BASE_ENV, "RIFFLE_COORDINATOR": self.url, **extra}

    def _spawn(self, module: str, name: str, config: str, env: dict[str, str]) -> Daemon:
        cfg = self.tmp / f"{name}.toml"
        cfg.write_text(config)
        port_file = self.tmp / f"{name}.ports.json"
        log = self.tmp / f"{name}.out"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", module, "--config", str(cfg), "--port-file", str(port_file)],
                                    env=env, stdout=out, stderr=subprocess.STDOUT)
        daemon = Daemon(proc, {}, log)
        try:
            daemon.ports = wait_for(lambda: proc.poll() is None and _ports(port_file) or
                                    (proc.poll() is not None and {"exited": proc.returncode}),
                                    timeout=60, what=f"{name} listening")
        except AssertionError:
            proc.kill()
            proc.wait()
            raise
        if "exited" in daemon.ports:
            raise AssertionError(f"{name} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        return daemon

    def start_coordinator(self, extra: str = "", tables: str = "", tell_servers: bool = True) -> None:
        """``tell_servers``: ``tell_servers_on_decommission`` (off by default in the product)."""
        self.coordinator = self._spawn("riffle_actors.coordinator", "coordinator", f"""grpc_port = 0
grpc_bind_address = "127.0.0.1"
http_port = 0
http_bind_address = "127.0.0.1"
expiry_check_interval_sec = 0.2
tell_servers_on_decommission = {str(tell_servers).lower()}
{extra}
[app]
heartbeat_timeout_sec = 5
[client_conf]
"rss.storage.type" = "MEMORY_LOCALFILE"
{tables}
""", {**BASE_ENV, "RIFFLE_ADMIN_TOKEN": ADMIN_TOKEN})

    def start_server(self, name: str, extra: str = "", min_disks: int = 1, tables: str = "",
                     admin_token: str | None = None) -> Daemon:
        """``admin_token``: the server's ``RIFFLE_ADMIN_TOKEN`` (its ``/admin`` routes and
        ``ShuffleServerInternal``); without it, admin actions on the server are refused (403)."""
        assert self.coordinator is not None
        data = self.tmp / f"{name}-data"
        server = self._spawn("riffle_actors.server", name, f"""grpc_port = 0
grpc_bind_address = "127.0.0.1"
http_port = 0
http_bind_address = "127.0.0.1"
coordinator_quorum = ["127.0.0.1:{self.coordinator.ports['grpc_port']}"]
heartbeat_interval_seconds = 1
grace_period_sec = 5
tags = ["{name}"]
{extra}
[memory_store]
capacity = "64M"
[localfile_store]
data_paths = ["{data}"]
min_number_of_available_disks = {min_disks}
{tables}
""", {**BASE_ENV, "RIFFLE_ADMIN_TOKEN": admin_token} if admin_token else BASE_ENV)
        self.servers.append(server)
        return server

    def wait_registered(self, count: int) -> list[dict[str, Any]]:
        def registered() -> list[dict[str, Any]] | None:
            servers = http_json(self.url + "/api/servers")
            return servers if len(servers) >= count else None

        return wait_for(registered, timeout=30, what=f"{count} servers registered")

    def ctl(self, *args: str, stdin: str | None = None, token: bool = True, **env: str) -> subprocess.CompletedProcess:
        extra = {"RIFFLE_ADMIN_TOKEN": ADMIN_TOKEN} if token else {}
        return subprocess.run([*CTL, *args], env=self.env(**extra, **env), input=stdin, capture_output=True,
                              text=True, timeout=60, check=False)

    def shell(self, command: str) -> subprocess.CompletedProcess:
        ctl = " ".join(shlex.quote(c) for c in CTL)
        return subprocess.run(["bash", "-o", "pipefail", "-c", command.replace("riffle-ctl", ctl)],
                              env=self.env(RIFFLE_ADMIN_TOKEN=ADMIN_TOKEN), capture_output=True, text=True,
                              timeout=60, check=False)

    def stop(self) -> None:
        for d in [*self.servers, self.coordinator]:
            if d is not None and d.proc.poll() is None:
                d.proc.terminate()
        for d in [*self.servers, self.coordinator]:
            if d is None:
                continue
            try:
                d.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                d.proc.kill()
                d.proc.wait()
