"""The coordinator's Uniffle-compatible REST API, field by field, against upstream's shapes.

Shapes from Apache Uniffle's ``coordinator/web/resource/ServerResource.java`` and
``ApplicationResource.java`` (``Response``: code / data / errMsg; ``ServerNode`` as Jackson writes
its getters; ``Application``; ``AppInfoVO``; ``UserAppNumVO``), checked against a real
coordinator with two real servers (``healthy`` ACTIVE, ``sick`` UNHEALTHY).
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request

import grpc
import pytest

from riffle_actors.protocol.proto import uniffle_pb2 as pb
from riffle_actors.protocol.proto import uniffle_pb2_grpc as pb_grpc
from tests.ctl.cluster import ADMIN_TOKEN, RealCluster, http_json
from tests.helpers import wait_for

pytestmark = pytest.mark.integration

SERVER_NODE_FIELDS = {
    "id", "ip", "grpcPort", "timestamp", "preAllocatedMemory", "availableMemory", "eventNumInFlush",
    "usedMemory", "tags", "status", "storageInfo", "registrationTime", "totalMemory", "nettyPort", "jettyPort",
    "startTime", "version", "gitCommitId", "appIdToInfos", "displayMetrics",
}
ENVELOPE = {"code", "data", "errMsg"}
JAVA_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")


def ok(body: dict) -> object:
    assert set(body) == ENVELOPE, body
    assert body["code"] == 0 and body["errMsg"] is None, body
    return body["data"]


def failed(body: dict) -> str:
    assert set(body) == ENVELOPE and body["code"] == -1 and body["data"] is None, body
    return body["errMsg"]


def by_tag(cluster: RealCluster) -> dict[str, dict]:
    return {t: s for s in http_json(cluster.url + "/api/servers") for t in s["tags"] if t in ("healthy", "sick")}


@pytest.fixture(scope="module")
def ready(cluster: RealCluster) -> dict[str, dict]:
    def settled() -> dict[str, dict] | None:
        s = by_tag(cluster)
        ok = (s.get("sick", {}).get("status") == "UNHEALTHY" and s.get("healthy", {}).get("status") == "ACTIVE"
              and all(x["disks"] for x in s.values()))
        return s if ok else None

    return wait_for(settled, timeout=30, what="healthy ACTIVE and sick UNHEALTHY, with disks reported")


def test_nodes_shape_field_by_field(cluster: RealCluster, ready: dict[str, dict]) -> None:
    nodes = ok(http_json(cluster.url + "/api/server/nodes"))
    ours = {s["id"]: s for s in http_json(cluster.url + "/api/servers")}
    assert [n["id"] for n in nodes] == sorted(ours)  # sorted by id, as upstream
    for node in nodes:
        assert set(node) == SERVER_NODE_FIELDS
        mine = ours[node["id"]]
        assert node["ip"] == "127.0.0.1" and node["grpcPort"] == mine["grpc_port"]
        assert node["jettyPort"] == mine["http_port"] and node["nettyPort"] == mine["netty_port"]
        assert node["status"] == mine["status"] and node["tags"] == mine["tags"]
        assert node["usedMemory"] == mine["used_memory"] and node["availableMemory"] == mine["available_memory"]
        assert node["preAllocatedMemory"] == mine["pre_allocated_memory"]
        assert node["totalMemory"] == node["usedMemory"] + node["availableMemory"] > 0
        assert node["eventNumInFlush"] == mine["event_num_in_flush"]
        assert node["timestamp"] == mine["last_heartbeat_ms"] and node["registrationTime"] == mine["registered_ms"]
        assert node["startTime"] == mine["start_time_ms"] > 0
        assert isinstance(node["version"], str) and isinstance(node["gitCommitId"], str)
        # the server's block-integrity totals ride in its heartbeat's displayMetrics (docs/faults.md)
        assert node["displayMetrics"] == {"corrupt_blocks": "0", "corrupt_reads_refused": "0",
                                          "refused_blocks": "0", "repaired_blocks": "0"}
        assert isinstance(node["appIdToInfos"], dict)
        assert set(node["storageInfo"]) == {d["mount_point"] for d in mine["disks"]}
        for mount, info in node["storageInfo"].items():
            assert set(info) == {"status", "type", "usedBytes"}  # StorageInfo's getters
            disk = next(d for d in mine["disks"] if d["mount_point"] == mount)
            assert info["status"] == disk["status"] and info["usedBytes"] == disk["used_bytes"]
            assert isinstance(info["type"], str)
    assert {n["status"] for n in nodes} == {"ACTIVE", "UNHEALTHY"}


def test_node_filters_one_node_and_summary(cluster: RealCluster, ready: dict[str, dict]) -> None:
    sick, healthy = ready["sick"]["id"], ready["healthy"]["id"]
    assert [n["id"] for n in ok(http_json(cluster.url + "/api/server/nodes?status=UNHEALTHY"))] == [sick]
    assert [n["id"] for n in ok(http_json(cluster.url + "/api/server/nodes?status=active"))] == [healthy]
    assert ok(http_json(cluster.url + "/api/server/nodes?status=EXCLUDED")) == []
    one = ok(http_json(f"{cluster.url}/api/server/nodes/{healthy}"))
    assert set(one) == SERVER_NODE_FIELDS and one["id"] == healthy
    assert ok(http_json(cluster.url + "/api/server/nodes/10.9.9.9-1")) is None  # upstream: success(null)
    assert ok(http_json(cluster.url + "/api/server/nodes/summary")) == {"ACTIVE": 1, "UNHEALTHY": 1}
    assert ok(http_json(cluster.url + "/api/server/status")) == "success"


def test_decommission_routes(cluster: RealCluster, ready: dict[str, dict]) -> None:
    healthy = ready["healthy"]["id"]
    url = cluster.url + "/api/server"
    with pytest.raises(urllib.error.HTTPError) as e:
        http_json(url + "/decommission", "POST", {"serverIds": [healthy]})
    assert e.value.code == 401  # admin routes need the token
    try:
        # data: what each server answered; these servers have no [admin] credentials, so they refuse
        # (the coordinator's override stands); tests/ctl/test_lifecycle.py covers servers that accept
        told = ok(http_json(url + "/decommission", "POST", {"serverIds": [healthy]}, ADMIN_TOKEN))
        assert told[healthy]["ok"] is False and told[healthy]["message"].startswith("ACCESS_DENIED")
        assert by_tag(cluster)["healthy"]["status"] == "DECOMMISSIONING"
        assert set(ok(http_json(url + "/cancelDecommission", "POST", {"serverIds": [healthy]}, ADMIN_TOKEN))) == \
            {healthy}
        assert by_tag(cluster)["healthy"]["status"] == "ACTIVE"
        assert set(ok(http_json(f"{url}/{healthy}/decommission", "POST", {}, ADMIN_TOKEN))) == {healthy}
        assert ok(http_json(cluster.url + "/api/server/nodes/summary")) == {"DECOMMISSIONING": 1, "UNHEALTHY": 1}
        assert set(ok(http_json(f"{url}/{healthy}/cancelDecommission", "POST", {}, ADMIN_TOKEN))) == {healthy}
        assert by_tag(cluster)["healthy"]["status"] == "ACTIVE"
        assert failed(http_json(url + "/decommission", "POST", {"serverIds": []}, ADMIN_TOKEN)) == \
            "Parameter[serverIds] should not be empty!"
        assert "10.9.9.9-1" in failed(http_json(url + "/decommission", "POST", {"serverIds": ["10.9.9.9-1"]},
                                                ADMIN_TOKEN))
    finally:
        http_json(f"{cluster.url}/api/servers/{healthy}/status", "POST", {"status": "ACTIVE"}, ADMIN_TOKEN)


def _register(cluster: RealCluster, apps: dict[str, str]) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{cluster.coordinator.ports['grpc_port']}") as channel:
        stub = pb_grpc.CoordinatorServerStub(channel)
        for app_id, user in apps.items():
            assert stub.registerApplicationInfo(pb.ApplicationInfoRequest(appId=app_id, user=user,
                                                                          version="0.9.2")).status == 0


def test_application_listings(cluster: RealCluster, ready: dict[str, dict]) -> None:
    apps = {f"application_17_{i:04d}": ("carol" if i < 3 else "dave") for i in range(5)}
    url = cluster.url + "/api/server/applications"

    def listed(body: dict) -> list[dict]:
        _register(cluster, apps)  # apps expire after 5 s of silence in this cluster: keep them alive
        return ok(http_json(url, "POST", body))

    everything = listed({"pageSize": 100, "appIdRegex": "application_17_.*"})
    assert [a["applicationId"] for a in everything] == sorted(apps)  # sorted by id, as upstream
    for a in everything:
        assert set(a) == {"applicationId", "user", "lastHeartBeatTime", "remoteStoragePath", "registrationTime"}
        assert a["user"] == apps[a["applicationId"]] and a["remoteStoragePath"] is None
        assert JAVA_TIME.match(a["lastHeartBeatTime"]) and JAVA_TIME.match(a["registrationTime"])
    page2 = listed({"pageSize": 2, "currentPage": 2, "appIdRegex": "application_17_.*"})
    assert [a["applicationId"] for a in page2] == sorted(apps)[2:4]
    chosen = listed({"applications": ["application_17_0001", "nope"]})
    assert [a["applicationId"] for a in chosen] == ["application_17_0001"]
    assert listed({"heartBeatEndTime": "1"}) == []
    assert failed(http_json(url, "POST", None)) == "ApplicationRequest Is not null"

    _register(cluster, apps)
    total = ok(http_json(cluster.url + "/api/app/total"))
    assert set(total) == {"appCurrent", "appTotality"} and total["appTotality"] >= total["appCurrent"] >= 5
    users = ok(http_json(cluster.url + "/api/app/userTotal"))
    assert all(set(u) == {"userName", "appNum"} for u in users)
    counts = {u["userName"]: u["appNum"] for u in users}
    assert counts["carol"] == 3 and counts["dave"] == 2
    assert [u["appNum"] for u in users] == sorted((u["appNum"] for u in users), reverse=True)
    infos = ok(http_json(cluster.url + "/api/app/appInfos"))
    mine = [i for i in infos if i["appId"] in apps]
    assert len(mine) == 5
    for info in mine:
        assert set(info) == {"userName", "appId", "updateTime", "registrationTime", "version", "gitCommitId",
                             "partitionNum", "memorySize", "localFileNum", "localTotalSize", "hadoopFileNum",
                             "hadoopTotalSize", "totalSize"}
        assert info["userName"] == apps[info["appId"]] and info["version"] == "0.9.2"
    assert [i["registrationTime"] for i in infos] == sorted((i["registrationTime"] for i in infos), reverse=True)


def test_coordinator_info_conf_and_metrics(cluster: RealCluster, ready: dict[str, dict]) -> None:
    info = ok(http_json(cluster.url + "/api/coordinator/info"))
    assert set(info) == {"coordinatorId", "serverIp", "serverPort", "serverWebPort", "version", "gitCommitId",
                         "startTime"}
    assert info["serverPort"] == str(cluster.coordinator.ports["grpc_port"])  # strings, as upstream
    assert info["serverWebPort"] == str(cluster.coordinator.ports["http_port"])
    assert info["serverIp"] == "127.0.0.1" and info["startTime"] > 0
    conf = ok(http_json(cluster.url + "/api/coordinator/conf"))
    assert all(set(c) == {"argumentKey", "argumentValue"} for c in conf)
    items = {c["argumentKey"]: c["argumentValue"] for c in conf}
    assert items["app.heartbeat_timeout_sec"] == "5.0" and items["http_bind_address"] == "127.0.0.1"
    assert items["client_conf"] == '{"rss.storage.type":"MEMORY_LOCALFILE"}'
    assert not any(k.startswith("admin") for k in items)  # secrets stay out
    with urllib.request.urlopen(cluster.url + "/api/coordinator/prometheus/metrics/all", timeout=10) as r:
        assert 'riffle_coordinator_servers{status="ACTIVE"} 1.0' in r.read().decode()
