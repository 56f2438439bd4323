"""A server's own lifecycle driven by an operator, against real processes: kill and decommission.

- ``riffle-ctl instance kill --force --coordinator URL`` stops the process through the server's HTTP
  ``/admin?kill=force`` (the SIGTERM path: exit code 0, the stop announced to the coordinator, which
  lists the server DECOMMISSIONED at once); refused with 403 by a server without ``[admin]``
  credentials and with 401 for wrong ones, and the server keeps running.
- ``riffle-ctl instance set --status decommissioning --coordinator URL`` (the coordinator tells the server over
  ``ShuffleServerInternal``): the server reports DECOMMISSIONING, gets no new assignments, keeps
  serving its app, and exits 0 once that app is unregistered; a cancellation before that keeps it
  running and ACTIVE.
- A SIGTERM during a kill's graceful stop does not cut it short.
"""

from __future__ import annotations

import json
import signal
import socket
import urllib.error
import zlib
from collections.abc import Iterator

import grpc
import pytest

from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pbg
from tests.ctl.cluster import ADMIN_TOKEN, BASE_ENV, Daemon, RealCluster, http_json, send_blocks
from tests.helpers import wait_for

pytestmark = pytest.mark.integration

#: decommission checks every 0.2 s here (the default is 10 s)
FAST = "decommission_check_interval_sec = 0.2"


@pytest.fixture
def cluster(tmp_path) -> Iterator[RealCluster]:
    c = RealCluster(tmp_path)
    try:
        c.start_coordinator()
        yield c
    finally:
        c.stop()


def sid(server: Daemon) -> str:
    return f"127.0.0.1-{server.ports['grpc_port']}"


def at(cluster: RealCluster, server: Daemon) -> tuple[str, ...]:
    """``--instance IP:HTTP_PORT --coordinator URL``: the coordinator's override of that server."""
    return ("--instance", f"127.0.0.1:{server.ports['http_port']}", "--coordinator", cluster.url)


def listed(cluster: RealCluster, server: Daemon) -> dict:
    return http_json(f"{cluster.url}/api/servers/{sid(server)}")


def wait_reported(cluster: RealCluster, server: Daemon, status: str) -> dict:
    return wait_for(lambda: (row := listed(cluster, server))["reported_status"] == status and row,
                    timeout=30, what=f"{sid(server)} reports {status}")


def wait_exit(server: Daemon) -> int:
    return wait_for(lambda: server.proc.poll() is not None and [server.proc.returncode], timeout=60,
                    what="the server process exits")[0]


def admin_http(server: Daemon, path: str, token: str | None) -> tuple[int, dict]:
    try:
        return 200, http_json(f"http://127.0.0.1:{server.ports['http_port']}{path}", "POST", {}, token)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def assigned_servers(cluster: RealCluster, app_id: str) -> set[str]:
    with grpc.insecure_channel(f"127.0.0.1:{cluster.coordinator.ports['grpc_port']}") as channel:
        stub = pbg.CoordinatorServerStub(channel)
        resp = stub.getShuffleAssignments(pb.GetShuffleServerRequest(
            applicationId=app_id, shuffleId=0, partitionNum=4, partitionNumPerRange=1, dataReplica=1))
        assert resp.status == 0, resp
        return {f"{s.ip}-{s.port}" for a in resp.assignments for s in a.server}


def send_more(grpc_port: int, app_id: str, shuffle_id: int, data: bytes) -> None:
    """One more shuffle of an existing app: register, reserve, send, and read the block ids back."""
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = pbg.ShuffleServerStub(channel)
        assert stub.registerShuffle(pb.ShuffleRegisterRequest(
            appId=app_id, shuffleId=shuffle_id,
            partitionRanges=[pb.ShufflePartitionRange(start=0, end=0)])).status == 0
        ticket = stub.requireBuffer(pb.RequireBufferRequest(requireSize=len(data) + 32, appId=app_id,
                                                            shuffleId=shuffle_id, partitionIds=[0]))
        assert ticket.status == 0, ticket
        sent = stub.sendShuffleData(pb.SendShuffleDataRequest(
            appId=app_id, shuffleId=shuffle_id, requireBufferId=ticket.requireBufferId,
            shuffleData=[pb.ShuffleData(partitionId=0, block=[pb.ShuffleBlock(
                blockId=1, length=len(data), uncompressLength=len(data), crc=zlib.crc32(data), data=data,
                taskAttemptId=1)])]))
        assert sent.status == 0, sent
        mem = stub.getMemoryShuffleData(pb.GetMemoryShuffleDataRequest(
            appId=app_id, shuffleId=shuffle_id, partitionId=0, lastBlockId=-1, readBufferSize=1 << 20))
        assert mem.status == 0 and mem.data == data, mem


def unregister(grpc_port: int, app_id: str) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        resp = pbg.ShuffleServerStub(channel).unregisterShuffleByAppId(pb.ShuffleUnregisterByAppIdRequest(appId=app_id))
        assert resp.status == 0, resp


def internal(server: Daemon, method: str, token: str | None):
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['grpc_port']}") as channel:
        stub = pbg.ShuffleServerInternalStub(channel)
        md = (("authorization", f"Bearer {token}"),) if token else None
        request = pb.DecommissionRequest() if method == "decommission" else pb.CancelDecommissionRequest()
        return getattr(stub, method)(request, metadata=md, timeout=10)


def test_kill_stops_the_server_and_needs_its_credentials(cluster: RealCluster) -> None:
    open_server = cluster.start_server("open")  # no [admin] credentials: admin actions refused (403)
    victim = cluster.start_server("victim", admin_token=ADMIN_TOKEN)
    cluster.wait_registered(2)
    wait_reported(cluster, victim, "ACTIVE")

    # straight at the server: 403 without configured credentials, 401 with wrong or none
    assert admin_http(open_server, "/admin/kill", ADMIN_TOKEN)[0] == 403
    code, body = admin_http(victim, "/admin/kill", "w" * 20)
    assert code == 401 and "admin credentials required" in body["error"]
    assert admin_http(victim, "/admin?operation=KILL", None)[0] == 401
    refused = internal(victim, "decommission", "w" * 20)
    assert refused.status == pb.ACCESS_DENIED and "credentials" in refused.retMsg
    assert internal(open_server, "decommission", ADMIN_TOKEN).status == pb.ACCESS_DENIED

    # through riffle-ctl: refused by the server, nothing marked, both keep running
    no_creds = cluster.ctl("instance", "kill", "--force", *at(cluster, open_server))
    assert no_creds.returncode == 1 and "HTTP 403" in no_creds.stderr, no_creds.stderr
    wrong = cluster.ctl("instance", "kill", "--force", *at(cluster, victim), token=False,
                        RIFFLE_ADMIN_TOKEN="w" * 20)
    assert wrong.returncode == 1 and "HTTP 401" in wrong.stderr
    assert open_server.proc.poll() is None and victim.proc.poll() is None
    assert listed(cluster, victim)["status"] == "ACTIVE" and listed(cluster, open_server)["status"] == "ACTIVE"

    killed = cluster.ctl("instance", "kill", "--force", *at(cluster, victim))
    assert killed.returncode == 0, killed.stderr
    assert killed.stdout.strip() == (f"{sid(victim)}: ACTIVE -> DECOMMISSIONED (server http://127.0.0.1:"
                                     f"{victim.ports['http_port']}: ACTIVE -> stopping (0 app(s)))")
    assert listed(cluster, victim)["status"] == "DECOMMISSIONED"  # right away
    assert wait_exit(victim) == 0
    # the server announced its own stop before exiting (not only the coordinator's override)
    assert listed(cluster, victim)["reported_status"] == "DECOMMISSIONED"
    assert "announced the stop to every coordinator" in victim.log.read_text()
    assert open_server.proc.poll() is None


def test_decommission_serves_the_app_then_exits(cluster: RealCluster) -> None:
    leaving = cluster.start_server("leaving", extra=FAST, admin_token=ADMIN_TOKEN)
    staying = cluster.start_server("staying", extra=FAST, admin_token=ADMIN_TOKEN)
    cluster.wait_registered(2)
    port = leaving.ports["grpc_port"]
    app = "application_1764547200000_0042"
    send_blocks(port, app, [b"x" * 1000])

    done = cluster.ctl("instance", "set", "--status", "decommissioning", *at(cluster, leaving))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"{sid(leaving)}: ACTIVE -> DECOMMISSIONING (server: decommissioning; "
                                   "the server stops once its 1 app(s) are gone)")
    wait_reported(cluster, leaving, "DECOMMISSIONING")  # the server's own heartbeat says so
    state = http_json(f"http://127.0.0.1:{leaving.ports['http_port']}/admin")
    assert (state["status"], state["apps"], state["state"]) == ("DECOMMISSIONING", 1, "DECOMMISSIONING")
    # no new partitions for it ...
    assert assigned_servers(cluster, "application_1764547200000_0043") == {sid(staying)}
    # ... while its app is still served (write and read), and it keeps running
    send_more(port, app, 1, b"still served")
    assert leaving.proc.poll() is None
    again = internal(leaving, "decommission", ADMIN_TOKEN)  # a no-op that succeeds, as upstream
    assert again.status == pb.SUCCESS and again.retMsg == "already decommissioning; 1 app(s) left"

    unregister(port, app)
    assert wait_exit(leaving) == 0
    assert listed(cluster, leaving)["status"] == "DECOMMISSIONED"
    assert "decommissioned: no app left" in leaving.log.read_text()
    assert staying.proc.poll() is None


def test_cancel_keeps_the_server_active(cluster: RealCluster) -> None:
    server = cluster.start_server("back", extra=FAST, admin_token=ADMIN_TOKEN)
    cluster.wait_registered(1)
    port = server.ports["grpc_port"]
    app = "application_1764547200000_0050"
    send_blocks(port, app, [b"y" * 500])
    # through the Uniffle-compatible route: the coordinator tells the server and returns its answer
    url = f"{cluster.url}/api/server/{sid(server)}"
    told = http_json(url + "/decommission", "POST", {}, ADMIN_TOKEN)
    assert told["code"] == 0 and told["data"][sid(server)]["ok"] is True, told
    wait_reported(cluster, server, "DECOMMISSIONING")

    cancel = cluster.ctl("instance", "set", "--status", "cancel-decommission", *at(cluster, server))
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout.strip() == f"{sid(server)}: DECOMMISSIONING -> ACTIVE (server: decommission cancelled; ACTIVE)"
    wait_reported(cluster, server, "ACTIVE")
    unregister(port, app)
    wait_for(lambda: http_json(f"http://127.0.0.1:{server.ports['http_port']}/admin")["apps"] == 0, timeout=30,
             what="the app gone")
    # no app left, yet no stop: several more heartbeats arrive (the 0.2 s check would have stopped it)
    seen = listed(cluster, server)["last_heartbeat_ms"]
    wait_for(lambda: listed(cluster, server)["last_heartbeat_ms"] >= seen + 2000, timeout=30,
             what="two more heartbeats")
    assert server.proc.poll() is None
    assert listed(cluster, server)["status"] == "ACTIVE"
    nothing = cluster.ctl("instance", "set", "--status", "cancel-decommission", *at(cluster, server))
    assert nothing.returncode == 0 and "nothing to cancel: the server is ACTIVE" in nothing.stdout


def test_by_default_the_coordinator_keeps_its_credentials_and_only_drains(tmp_path) -> None:
    """``tell_servers_on_decommission`` off (the default): no credentials leave the coordinator; the
    server is drained by the coordinator's override alone, and ctl says the server was not told."""
    c = RealCluster(tmp_path)
    try:
        c.start_coordinator(tell_servers=False)
        server = c.start_server("drained", extra=FAST, admin_token=ADMIN_TOKEN)
        c.wait_registered(1)
        done = c.ctl("instance", "set", "--status", "decommissioning", *at(c, server))
        assert done.returncode == 0, done.stderr
        assert "tell_servers_on_decommission is off" in done.stdout and "was not told" in done.stderr
        assert listed(c, server)["status"] == "DECOMMISSIONING"
        # the server was not told: it still reports ACTIVE, and keeps running without apps
        seen = listed(c, server)["last_heartbeat_ms"]
        wait_for(lambda: listed(c, server)["last_heartbeat_ms"] >= seen + 2000, timeout=30, what="more heartbeats")
        assert listed(c, server)["reported_status"] == "ACTIVE" and server.proc.poll() is None
    finally:
        c.stop()


def test_sigterm_during_a_kill_is_not_a_second_signal(tmp_path) -> None:
    """A kill starts the graceful stop; a SIGTERM arriving meanwhile (systemd, an operator) must not
    turn it into an immediate exit. The stop is held in its announcement step by a "coordinator"
    that accepts connections and never answers (up to 2 s), so the SIGTERM lands inside it."""
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)
    c = RealCluster(tmp_path)
    try:
        server = c._spawn("riffle_actors.server", "alone", f"""grpc_port = 0
grpc_bind_address = "127.0.0.1"
http_port = 0
http_bind_address = "127.0.0.1"
coordinator_quorum = ["127.0.0.1:{mute.getsockname()[1]}"]
heartbeat_interval_seconds = 1
[localfile_store]
data_paths = ["{tmp_path / 'data'}"]
""", {**BASE_ENV, "RIFFLE_ADMIN_TOKEN": ADMIN_TOKEN})
        c.servers.append(server)
        code, body = admin_http(server, "/admin/kill", ADMIN_TOKEN)
        assert code == 200 and body["status"] == "STOPPING", body
        wait_for(lambda: "stopping: killed by an operator" in server.log.read_text(), timeout=30,
                 what="the graceful stop under way")
        assert server.proc.poll() is None  # still announcing to the mute coordinator
        server.proc.send_signal(signal.SIGTERM)
        assert wait_exit(server) == 0
        log = server.log.read_text()
        assert "SIGTERM received: already stopping gracefully" in log and "second SIGTERM" not in log
    finally:
        c.stop()
        mute.close()
