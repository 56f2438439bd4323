"""An in-process coordinator on port 0, driven by a client built from the UPSTREAM Uniffle proto.

Covers what a Spark driver and a shuffle server need from the coordinator (spec §7.4), the HTTP
JSON API, expiry and exclude-file reload driven by a ManualClock, and the server-side
HeartbeatActor talking to it.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import pytest_asyncio
from google.protobuf import empty_pb2

from riffle_actors.runtime import ActorSystem
from riffle_actors.actors.heartbeat import (
    DiskSnapshot,
    GetHeartbeatStats,
    HeartbeatActor,
    HeartbeatSnapshot,
    SendHeartbeatNow,
)
from riffle_actors.runtime import ManualClock, TimerActor
from riffle_actors.coordinator.config import CoordinatorConfig
from riffle_actors.coordinator_server import Coordinator
from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pb_grpc
from riffle_actors.transport.coordinator_client import GrpcCoordinatorLink
from tests.helpers import poll_until
from tests.helpers.upstream_proto import load_upstream_proto

pytestmark = pytest.mark.integration

CLIENT_CONF = {"rss.storage.type": "MEMORY_LOCALFILE", "rss.client.type": "GRPC"}
ADMIN_TOKEN = "test-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}




def make_config(**kw: Any) -> CoordinatorConfig:
    data: dict[str, Any] = {
        "grpc_port": 0,
        "grpc_bind_address": "127.0.0.1",
        "http_port": 0,
        "http_bind_address": "127.0.0.1",
        "client_conf": CLIENT_CONF,
        "admin": {"token": ADMIN_TOKEN},
    }
    data.update(kw)
    return CoordinatorConfig.model_validate(data)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1000.0, wall_start=1_800_000_000.0)


@pytest_asyncio.fixture
async def coordinator(clock: ManualClock) -> AsyncIterator[Coordinator]:
    async with Coordinator(make_config(), clock=clock) as c:
        yield c


@pytest.fixture(scope="module")
def upstream() -> tuple[Any, Any]:
    return load_upstream_proto()


@pytest_asyncio.fixture
async def up_stub(coordinator: Coordinator, upstream: tuple[Any, Any]) -> AsyncIterator[Any]:
    _, up_grpc = upstream
    async with grpc.aio.insecure_channel(f"127.0.0.1:{coordinator.grpc_port}") as channel:
        yield up_grpc.CoordinatorServerStub(channel)


@pytest_asyncio.fixture
async def http(coordinator: Coordinator) -> AsyncIterator[Callable[..., Any]]:
    async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{coordinator.http_port}") as session:

        async def call(method: str, path: str, **kw: Any) -> tuple[int, Any]:
            async with session.request(method, path, **kw) as resp:
                return resp.status, await resp.json()

        yield call


def up_heartbeat(up_pb: Any, i: int, *, tags: tuple[str, ...] = ("ss_v5", "GRPC"), **kw: Any) -> Any:
    """A heartbeat as the 0.9.2 upstream proto encodes it (no jetty_port, no 0.10 fields)."""
    return up_pb.ShuffleServerHeartBeatRequest(
        serverId=up_pb.ShuffleServerId(id=f"127.0.0.{i}-1999{i}", ip=f"127.0.0.{i}", port=19990 + i, netty_port=0),
        usedMemory=10,
        preAllocatedMemory=1,
        availableMemory=kw.pop("available", 1 << 30),
        eventNumInFlush=0,
        tags=list(tags),
        **kw,
    )


async def register_two_servers(up_stub: Any, up_pb: Any) -> None:
    for i in (1, 2):
        resp = await up_stub.heartbeat(up_heartbeat(up_pb, i))
        assert resp.status == up_pb.SUCCESS


# ----------------------------------------------------------------------------- what a driver needs


async def test_upstream_driver_flow_gets_success_and_a_full_assignment(
    up_stub: Any, upstream: tuple[Any, Any], http: Callable[..., Any]
) -> None:
    up_pb, _ = upstream
    await register_two_servers(up_stub, up_pb)

    methods = up_pb.DESCRIPTOR.services_by_name["CoordinatorServer"].methods_by_name
    if "fetchClientConfV2" in methods:  # the 0.10 driver's call
        conf = await up_stub.fetchClientConfV2(up_pb.FetchClientConfRequest(user="alice"))
    else:  # the 0.9.2 proto predates V2
        conf = await up_stub.fetchClientConf(empty_pb2.Empty())
    assert conf.status == up_pb.SUCCESS
    assert {i.key: i.value for i in conf.clientConf} == CLIENT_CONF

    resp = await up_stub.getShuffleAssignments(
        up_pb.GetShuffleServerRequest(
            applicationId="app-1_1",
            shuffleId=3,
            partitionNum=10,
            partitionNumPerRange=1,
            dataReplica=2,
            requireTags=["ss_v5", "GRPC"],
            assignmentShuffleServerNumber=-1,
            estimateTaskConcurrency=4,
        )
    )
    assert resp.status == up_pb.SUCCESS, resp.retMsg
    per_partition = {}
    for a in resp.assignments:
        for p in range(a.startPartition, a.endPartition + 1):
            assert p not in per_partition
            per_partition[p] = [(s.id, s.ip, s.port, s.netty_port) for s in a.server]
    assert sorted(per_partition) == list(range(10))
    expected = {("127.0.0.1-19991", "127.0.0.1", 19991, 0), ("127.0.0.2-19992", "127.0.0.2", 19992, 0)}
    for servers in per_partition.values():
        assert set(servers) == expected  # 2 replicas on 2 distinct servers

    info = await up_stub.registerApplicationInfo(up_pb.ApplicationInfoRequest(appId="app-1_1", user="alice"))
    assert info.status == up_pb.SUCCESS and info.retMsg == ""
    beat = await up_stub.appHeartbeat(up_pb.AppHeartBeatRequest(appId="app-1_1"))
    assert beat.status == up_pb.SUCCESS

    status, apps = await http("GET", "/api/apps")
    assert status == 200
    [app] = apps
    assert app["app_id"] == "app-1_1" and app["user"] == "alice"
    assert app["shuffles"] == 1 and app["partitions"] == 10
    assert app["servers"] == ["127.0.0.1-19991", "127.0.0.2-19992"]
    assert app["last_heartbeat_ms"] >= 1_800_000_000_000


async def test_fetch_client_conf_v2_exists_for_010_drivers(coordinator: Coordinator) -> None:
    # 0.9.2's proto has no V2, so check it with our own (0.10) proto: same method path.
    async with grpc.aio.insecure_channel(f"127.0.0.1:{coordinator.grpc_port}") as channel:
        stub = pb_grpc.CoordinatorServerStub(channel)
        resp = await stub.fetchClientConfV2(pb.FetchClientConfRequest(user="bob", properties={"k": "v"}))
        assert resp.status == pb.SUCCESS
        assert {i.key: i.value for i in resp.clientConf} == CLIENT_CONF
        resp = await stub.getShuffleAssignments(pb.GetShuffleServerRequest(partitionNum=1, dataReplica=1))
        assert resp.status == pb.INTERNAL_ERROR and "0 server(s) registered" in resp.retMsg


async def test_client_requiring_grpc_netty_is_told_to_use_grpc(up_stub: Any, upstream: tuple[Any, Any]) -> None:
    up_pb, _ = upstream
    await register_two_servers(up_stub, up_pb)
    resp = await up_stub.getShuffleAssignments(
        up_pb.GetShuffleServerRequest(
            applicationId="a", partitionNum=4, partitionNumPerRange=1, dataReplica=1, requireTags=["ss_v5", "GRPC_NETTY"]
        )
    )
    assert resp.status == up_pb.INTERNAL_ERROR
    assert "no server offers GRPC_NETTY" in resp.retMsg and "spark.rss.client.type=GRPC" in resp.retMsg
    assert len(resp.assignments) == 0


async def test_the_other_coordinator_rpcs(up_stub: Any, upstream: tuple[Any, Any], http: Callable[..., Any]) -> None:
    up_pb, _ = upstream
    avail = await up_stub.checkServiceAvailable(empty_pb2.Empty())
    assert avail.status == up_pb.SUCCESS and avail.available is False
    await register_two_servers(up_stub, up_pb)
    avail = await up_stub.checkServiceAvailable(empty_pb2.Empty())
    assert avail.available is True

    listed = await up_stub.getShuffleServerList(empty_pb2.Empty())
    assert [s.id for s in listed.servers] == ["127.0.0.1-19991", "127.0.0.2-19992"]
    assert (await up_stub.getShuffleServerNum(empty_pb2.Empty())).num == 2

    remote = await up_stub.fetchRemoteStorage(up_pb.FetchRemoteStorageRequest(appId="a"))
    assert remote.status == up_pb.SUCCESS and remote.remoteStorage.path == ""

    access = await up_stub.accessCluster(up_pb.AccessClusterRequest(accessId="x", tags=["ss_v5"], user="u"))
    assert access.status == up_pb.SUCCESS and access.uuid

    op = await up_stub.reportClientOperation(
        up_pb.ReportShuffleClientOpRequest(clientHost="h", clientPort=1, operation="op")
    )
    assert op.status == up_pb.SUCCESS

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await up_stub.getShuffleDataStorageInfo(empty_pb2.Empty())
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED

    _, health = await http("GET", "/api/health")
    assert health["rpc_calls"]["heartbeat"] == 2 and health["rpc_calls"]["checkServiceAvailable"] == 2


async def test_remote_storage_is_returned_when_configured(clock: ManualClock) -> None:
    cfg = make_config(remote_storage={"path": "hdfs://nn/rss", "conf": {"dfs.replication": "2"}})
    async with (
        Coordinator(cfg, clock=clock) as c,
        grpc.aio.insecure_channel(f"127.0.0.1:{c.grpc_port}") as channel,
    ):
        resp = await pb_grpc.CoordinatorServerStub(channel).fetchRemoteStorage(pb.FetchRemoteStorageRequest())
    assert resp.remoteStorage.path == "hdfs://nn/rss"
    assert [(i.key, i.value) for i in resp.remoteStorage.remoteStorageConf] == [("dfs.replication", "2")]


# ----------------------------------------------------------------------------- HTTP API


async def test_http_lists_servers_with_their_heartbeat_fields(
    up_stub: Any, upstream: tuple[Any, Any], http: Callable[..., Any]
) -> None:
    up_pb, _ = upstream
    await up_stub.heartbeat(up_heartbeat(up_pb, 1, available=12345))
    status, servers = await http("GET", "/api/servers")
    assert status == 200
    [s] = servers
    assert s["id"] == "127.0.0.1-19991" and s["ip"] == "127.0.0.1"
    assert (s["grpc_port"], s["netty_port"], s["http_port"]) == (19991, 0, 0)
    assert s["status"] == "ACTIVE" and s["tags"] == ["GRPC", "ss_v5"]
    assert (s["used_memory"], s["pre_allocated_memory"], s["available_memory"]) == (10, 1, 12345)
    assert s["assigned_partitions"] == 0 and s["last_heartbeat_ms"] == 1_800_000_000_000
    status, one = await http("GET", "/api/servers/127.0.0.1-19991")
    assert status == 200 and one == s
    status, err = await http("GET", "/api/servers/nope")
    assert status == 404 and "nope" in err["error"]
    status, health = await http("GET", "/api/health")
    assert status == 200 and health["status"] == "ok" and health["servers"] == 1 and health["active_servers"] == 1


async def test_operator_can_drain_and_reactivate_a_server(
    up_stub: Any, upstream: tuple[Any, Any], http: Callable[..., Any]
) -> None:
    up_pb, _ = upstream
    await register_two_servers(up_stub, up_pb)

    async def set_status(sid: str, **body: Any) -> tuple[int, Any]:
        result: tuple[int, Any] = await http("POST", f"/api/servers/{sid}/status", headers=ADMIN, **body)
        return result

    status, body = await set_status("127.0.0.1-19991", json={"status": "DECOMMISSIONING"})
    assert status == 200 and body["status"] == "DECOMMISSIONING" and body["operator_status"] == "DECOMMISSIONING"

    def request() -> Any:
        return up_pb.GetShuffleServerRequest(applicationId="a", partitionNum=6, dataReplica=1, requireTags=["ss_v5"])

    resp = await up_stub.getShuffleAssignments(request())
    assert {s.id for a in resp.assignments for s in a.server} == {"127.0.0.2-19992"}
    status, body = await set_status("127.0.0.1-19991", json={"status": "ACTIVE"})
    assert status == 200 and body["status"] == "ACTIVE" and body["operator_status"] is None
    resp = await up_stub.getShuffleAssignments(request())
    assert {s.id for a in resp.assignments for s in a.server} == {"127.0.0.1-19991", "127.0.0.2-19992"}

    assert (await set_status("127.0.0.1-19991", json={"status": "LOST"}))[0] == 400
    assert (await set_status("127.0.0.1-19991", data=b"not json"))[0] == 400
    assert (await set_status("nope", json={"status": "ACTIVE"}))[0] == 404


# ----------------------------------------------------------------------------- expiry (ManualClock)


async def test_silent_servers_and_apps_expire_on_the_clock(
    coordinator: Coordinator, clock: ManualClock, up_stub: Any, upstream: tuple[Any, Any], http: Callable[..., Any]
) -> None:
    up_pb, _ = upstream
    await register_two_servers(up_stub, up_pb)
    await up_stub.registerApplicationInfo(up_pb.ApplicationInfoRequest(appId="old", user="u"))
    clock.advance(20)
    await up_stub.heartbeat(up_heartbeat(up_pb, 2))
    await up_stub.appHeartbeat(up_pb.AppHeartBeatRequest(appId="young"))
    clock.advance(11)  # server 1 silent for 31 s > 30 s; both apps younger than 60 s

    async def server_ids() -> list[str]:
        return [s["id"] for s in (await http("GET", "/api/servers"))[1]]

    await poll_until(lambda: _eq(server_ids(), ["127.0.0.2-19992"]))
    clock.advance(30)  # app "old" silent 61 s
    await poll_until(lambda: _eq(_app_ids(http, "/api/historical_apps"), ["old"]))
    assert await _app_ids(http, "/api/apps") == ["young"]


async def _eq(value: Any, expected: Any) -> bool:
    return (await value) == expected


async def _app_ids(http: Callable[..., Any], path: str) -> list[str]:
    return [a["app_id"] for a in (await http("GET", path))[1]]


async def test_exclude_file_changes_are_picked_up(clock: ManualClock, tmp_path: Path, upstream: tuple[Any, Any]) -> None:
    up_pb, up_grpc = upstream
    exclude = tmp_path / "exclude"
    exclude.write_text("127.0.0.1-19991\n")
    cfg = make_config(exclude_nodes_file=str(exclude), exclude_nodes_check_interval_sec=5)
    async with (
        Coordinator(cfg, clock=clock) as c,
        grpc.aio.insecure_channel(f"127.0.0.1:{c.grpc_port}") as channel,
    ):
        stub = up_grpc.CoordinatorServerStub(channel)
        await register_two_servers(stub, up_pb)

        async def used() -> set[str]:
            resp = await stub.getShuffleAssignments(
                up_pb.GetShuffleServerRequest(applicationId="a", partitionNum=4, dataReplica=1)
            )
            return {s.id for a in resp.assignments for s in a.server}

        assert await used() == {"127.0.0.2-19992"}
        exclude.write_text("127.0.0.2-19992\n# 127.0.0.1-19991\n")
        clock.advance(5)
        await poll_until(lambda: _eq(used(), {"127.0.0.1-19991"}))


# ----------------------------------------------------------------------------- HeartbeatActor


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_heartbeat_actor_registers_the_server_and_tolerates_a_dead_coordinator(
    coordinator: Coordinator, clock: ManualClock, http: Callable[..., Any]
) -> None:
    live = f"127.0.0.1:{coordinator.grpc_port}"
    dead = f"127.0.0.1:{_free_port()}"
    snapshot = HeartbeatSnapshot(
        ip="127.0.0.9",
        grpc_port=19999,
        http_port=20010,
        tags=("ssd",),
        used_memory=100,
        pre_allocated_memory=20,
        available_memory=900,
        event_num_in_flush=3,
        disks=(DiskSnapshot(path="/data1", capacity_bytes=1000, used_bytes=10, status="NORMAL"),),
        start_time_ms=1234,
    )
    system = ActorSystem(clock=clock)
    try:
        await system.spawn(TimerActor(), name="timer")  # the rounds are due on it
        ref = await system.spawn(HeartbeatActor([dead, live], 10.0, lambda: snapshot, clock=clock,
                                                 connect=GrpcCoordinatorLink))
        # The first heartbeat goes out at start, without waiting for the interval.
        servers = await poll_until(lambda: _servers_if_any(http))
        [s] = servers
        assert s["id"] == "127.0.0.9-19999" and s["http_port"] == 20010 and s["netty_port"] == 0
        assert s["tags"] == ["GRPC", "ss_v5", "ssd"] and s["is_healthy"] is True
        assert (s["used_memory"], s["pre_allocated_memory"], s["available_memory"]) == (100, 20, 900)
        assert s["event_num_in_flush"] == 3 and s["start_time_ms"] == 1234
        assert s["disks"] == [
            {"mount_point": "/data1", "media": "HDD", "capacity": 1000, "used_bytes": 10, "status": "NORMAL"}
        ]
        assert await ref.ask(SendHeartbeatNow(), timeout=15) == {dead: False, live: True}
        stats = await ref.ask(GetHeartbeatStats())
        assert stats.reachable == {dead: False, live: True} and stats.failed >= 1 and stats.sent_ok >= 2
        # The next round comes from the clock.
        rounds = stats.rounds
        clock.advance(10)
        await poll_until(lambda: _rounds_above(ref, rounds))
    finally:
        await system.stop_all()


async def _servers_if_any(http: Callable[..., Any]) -> list[dict[str, Any]]:
    return (await http("GET", "/api/servers"))[1]


async def _rounds_above(ref: Any, n: int) -> bool:
    return (await ref.ask(GetHeartbeatStats())).rounds > n
