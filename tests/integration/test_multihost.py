"""A coordinator and two shuffle servers on three "hosts": one network namespace each.

Topology (everything created by the fixture and removed at teardown, even on failure)::

    netns <tag>-br : bridge br0 10.231.0.1/24, one veth end per host
    netns <tag>-c  : eth0 10.231.0.10/24, default via .1   -> riffle-coordinator (gRPC 21000, HTTP 21001)
    netns <tag>-s1 : eth0 10.231.0.11/24, default via .1   -> riffle-server (gRPC 19999, HTTP 20010)
    netns <tag>-s2 : eth0 10.231.0.12/24, default via .1   -> riffle-server

The 10.231.0.0/24 addresses exist only inside those namespaces; the test's own namespace is
never touched. Fixed ports are safe here (every namespace has its own port space) and needed:
a restarted server must come back with the same id ``<ip>-<grpcPort>``. Each server finds its
advertised IP from its default route (``riffle_actors.netaddr``), not from ``WORKER_IP``.

Checked: both servers register; assignments spread over both; after SIGKILL of one server it
disappears from assignments once the coordinator's heartbeat timeout passed; restarted, it
comes back. Queries go through a small agent process inside the coordinator's namespace.
Skipped (with the reason) when not root or when network namespaces are unavailable.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_for
from tests.helpers.netlab import NetLab, netns_problem

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SUBNET = "10.231.0"
BRIDGE_IP = f"{SUBNET}.1"
HOSTS = {"c": f"{SUBNET}.10", "s1": f"{SUBNET}.11", "s2": f"{SUBNET}.12"}
COORD_GRPC, COORD_HTTP = 21000, 21001
SERVER_GRPC, SERVER_HTTP = 19999, 20010
SERVER_HEARTBEAT_TIMEOUT_S = 5

ENV = {k: v for k, v in os.environ.items() if k != "WORKER_IP"}
ENV["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")

AGENT = r"""
import json, sys, urllib.request
import grpc
from riffle_actors.protocol.proto import uniffle_pb2 as pb, uniffle_pb2_grpc as pb_grpc
ip, grpc_port, http_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
stub = pb_grpc.CoordinatorServerStub(grpc.insecure_channel(f"{ip}:{grpc_port}"))
for line in sys.stdin:
    req = json.loads(line)
    try:
        if req["op"] == "servers":
            with urllib.request.urlopen(f"http://{ip}:{http_port}/api/servers", timeout=5) as r:
                out = json.loads(r.read())
        else:
            resp = stub.getShuffleAssignments(pb.GetShuffleServerRequest(
                applicationId="multihost_1", shuffleId=req["shuffle"], partitionNum=req["partitions"],
                partitionNumPerRange=1, dataReplica=1, requireTags=["ss_v5", "GRPC"]), timeout=10)
            out = {"status": resp.status, "msg": resp.retMsg,
                   "partitions": sorted(p for a in resp.assignments for p in range(a.startPartition, a.endPartition + 1)),
                   "servers": sorted({s.id for a in resp.assignments for s in a.server})}
    except Exception as e:
        out = {"error": repr(e)}
    print(json.dumps(out), flush=True)
"""




@pytest.fixture
def lab(tmp_path: Path) -> Iterator[NetLab]:
    reason = netns_problem()
    if reason:
        pytest.skip(reason)
    lab = NetLab(f"rfl{uuid.uuid4().hex[:6]}", tmp_path, HOSTS, bridge_ip=BRIDGE_IP, env=ENV)
    try:
        lab.build()
        yield lab
    finally:
        lab.teardown()


class Agent:
    """A line-oriented JSON query process inside the coordinator's namespace."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.proc = proc

    def query(self, req: dict[str, Any], timeout: float = 20.0) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"agent did not answer {req} within {timeout}s"
        return json.loads(self.proc.stdout.readline())

    def servers(self) -> dict[str, dict[str, Any]]:
        out = self.query({"op": "servers"})
        return {} if "error" in out else {s["id"]: s for s in out}

    def assigned_servers(self, shuffle: int, partitions: int = 20) -> list[str] | None:
        out = self.query({"op": "assign", "shuffle": shuffle, "partitions": partitions})
        if "error" in out or out["status"] != 0:
            return None
        assert out["partitions"] == list(range(partitions))
        return out["servers"]


def wait_port_file(path: Path, proc: subprocess.Popen[str], timeout: float = 60.0) -> dict[str, int]:
    def ready() -> dict[str, int] | None:
        assert proc.poll() is None, f"process exited early with {proc.returncode} (see {path.parent})"
        try:
            ports = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return ports if ports.get("pid") == proc.pid else None

    return wait_for(ready, timeout, f"port file {path}")


def write_coordinator_config(path: Path) -> None:
    path.write_text(
        f"grpc_port = {COORD_GRPC}\nhttp_port = {COORD_HTTP}\nexpiry_check_interval_sec = 0.5\n"
        f"[server]\nheartbeat_timeout_sec = {SERVER_HEARTBEAT_TIMEOUT_S}\n"
        f'[client_conf]\n"rss.storage.type" = "MEMORY_LOCALFILE"\n'
        f'[log]\npath = "{path.parent / "coordinator.log"}"\nlevel = "DEBUG"\n'
    )


def write_server_config(path: Path, data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"grpc_port = {SERVER_GRPC}\nhttp_port = {SERVER_HTTP}\n"
        f'coordinator_quorum = ["{HOSTS["c"]}:{COORD_GRPC}"]\n'
        "heartbeat_interval_seconds = 1\ngrace_period_sec = 0\n"
        '[memory_store]\ncapacity = "64M"\n'
        f'[localfile_store]\ndata_paths = ["{data_dir}"]\n'
        f'[log]\npath = "{path.parent / (path.stem + ".log")}"\nlevel = "DEBUG"\n'
    )


def test_servers_register_spread_disappear_when_killed_and_come_back(lab: NetLab, tmp_path: Path) -> None:
    coord_cfg = tmp_path / "coordinator.toml"
    write_coordinator_config(coord_cfg)
    coord_ports = tmp_path / "coordinator.ports.json"
    coordinator = lab.popen("c", ["-m", "riffle_actors.coordinator", "--config", str(coord_cfg),
                                  "--port-file", str(coord_ports)])
    wait_port_file(coord_ports, coordinator)

    def start_server(name: str) -> subprocess.Popen[str]:
        cfg = tmp_path / f"{name}.toml"
        write_server_config(cfg, tmp_path / f"{name}-data")
        ports = tmp_path / f"{name}.ports.json"
        ports.unlink(missing_ok=True)  # a SIGKILLed server leaves its port file behind
        proc = lab.popen(name, ["-m", "riffle_actors.server", "--config", str(cfg), "--port-file", str(ports)])
        got = wait_port_file(ports, proc)
        assert (got["grpc_port"], got["http_port"]) == (SERVER_GRPC, SERVER_HTTP)
        return proc

    servers = {name: start_server(name) for name in ("s1", "s2")}
    agent = Agent(
        lab.popen("c", ["-c", AGENT, HOSTS["c"], str(COORD_GRPC), str(COORD_HTTP)],
                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    )
    s1_id, s2_id = f"{HOSTS['s1']}-{SERVER_GRPC}", f"{HOSTS['s2']}-{SERVER_GRPC}"

    # 1. Both servers register, advertising their own namespace's address.
    listed = wait_for(lambda: (s := agent.servers()) and set(s) == {s1_id, s2_id} and s, 60, "both servers listed")
    for name, sid in (("s1", s1_id), ("s2", s2_id)):
        assert listed[sid]["ip"] == HOSTS[name] and listed[sid]["grpc_port"] == SERVER_GRPC
        assert listed[sid]["http_port"] == SERVER_HTTP and listed[sid]["status"] == "ACTIVE"
        assert {"ss_v5", "GRPC"} <= set(listed[sid]["tags"])

    # 2. A shuffle's partitions are spread over both.
    assert agent.assigned_servers(shuffle=0) == [s1_id, s2_id]

    # 3. SIGKILL s1: it is dropped after the heartbeat timeout and no longer assigned.
    servers["s1"].send_signal(signal.SIGKILL)
    servers["s1"].wait(10)
    shuffle = iter(range(1, 10_000))
    wait_for(lambda: agent.assigned_servers(next(shuffle)) == [s2_id], SERVER_HEARTBEAT_TIMEOUT_S + 20,
             "s1 gone from assignments")
    # Stale servers stop being candidates at once; the registry drops them on its next sweep.
    wait_for(lambda: set(agent.servers()) == {s2_id}, 10, "s1 dropped from /api/servers")

    # 4. Restarted, s1 comes back under the same id and gets partitions again.
    servers["s1"] = start_server("s1")
    wait_for(lambda: agent.assigned_servers(next(shuffle)) == [s1_id, s2_id], 60, "s1 back in assignments")

    # The coordinator shuts down cleanly on SIGTERM.
    coordinator.send_signal(signal.SIGTERM)
    assert coordinator.wait(20) == 0
