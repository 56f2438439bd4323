"""Heartbeat validation (coordinator/validation.py, pure) and the registry's admission rules (cluster.py)."""

from __future__ import annotations

from typing import Any

import pytest

from riffle_actors.runtime import ManualClock
from riffle_actors.coordinator.cluster import ClusterRegistry, HeartbeatRefused, ServerHeartbeat
from riffle_actors.transport.coordinator_grpc import decode_heartbeat
from riffle_actors.coordinator.validation import (
    InvalidHeartbeat,
    RepeatFilter,
    check_heartbeat,
    heartbeat_problems,
    id_problem,
    parse_networks,
    peer_host,
    reject_message,
    source_problem,
)
from riffle_actors.protocol.proto import uniffle_pb2 as pb


def beat(ip: str = "10.0.0.1", port: int = 19999, sid: str | None = None, **kw: Any) -> Any:
    """A heartbeat as a Riffle / riffle_actors server sends it; ``kw`` overrides fields."""
    sid = f"{ip}-{port}" if sid is None else sid
    server = {"id": sid, "ip": ip, "port": port, "netty_port": 0, "jetty_port": 20010}
    server.update(kw.pop("server", {}))
    fields: dict[str, Any] = {
        "usedMemory": 10,
        "preAllocatedMemory": 1,
        "availableMemory": 1 << 30,
        "eventNumInFlush": 0,
        "tags": ["ss_v5", "GRPC"],
        "version": "0.1.0",
    }
    fields.update(kw)
    return pb.ShuffleServerHeartBeatRequest(serverId=pb.ShuffleServerId(**server), **fields)


def fields_of(problems: list[str]) -> list[str]:
    return [p.split(":", 1)[0] for p in problems]


# ----------------------------------------------------------------------------- what real servers send


def test_real_servers_heartbeats_are_accepted() -> None:
    assert heartbeat_problems(beat()) == []
    # a Java 0.10 server without Netty: netty_port -1, status set, storageInfo and apps filled
    java = beat(
        server={"netty_port": -1, "jetty_port": 19998},
        status=pb.ACTIVE,
        storageInfo={"/data1/rss": pb.StorageInfo(mountPoint="/data1", capacity=10**12, usedBytes=10**9)},
        applicationInfo=[pb.ApplicationInfo(appId="app-1_1", partitionNum=3)],
        gitCommitId="abc123",
        startTimeMs=1_700_000_000_000,
    )
    assert heartbeat_problems(java) == []
    # with Netty: the id carries the netty port; a 0.9 server sends no jetty port; IPv6 works
    assert heartbeat_problems(beat(sid="10.0.0.1-19999-17000", server={"netty_port": 17000})) == []
    assert heartbeat_problems(beat(server={"jetty_port": 0})) == []
    assert heartbeat_problems(beat(ip="fd00::5", port=19999)) == []
    assert heartbeat_problems(beat(sid="")) == []  # decode derives "<ip>-<port>"
    assert heartbeat_problems(beat(sid="shuffle-host-a.example")) == []  # an opaque id


def test_a_huge_free_memory_claim_is_not_invalid_by_itself() -> None:
    assert heartbeat_problems(beat(availableMemory=10**12, usedMemory=0)) == []


# ----------------------------------------------------------------------------- the finding's bad heartbeats


@pytest.mark.parametrize(
    "ip", ["127.0.0.1; rm -rf", "", "not-an-ip", "10.0.0.256", "0.0.0.0", "::", "224.0.0.1", "1" * 100]
)
def test_the_ip_must_be_an_address_clients_can_reach(ip: str) -> None:
    problems = heartbeat_problems(beat(ip=ip, sid="x"))
    assert fields_of(problems) == ["serverId.ip"], problems


@pytest.mark.parametrize(
    ("server", "field"),
    [
        ({"port": 70000}, "serverId.port"),
        ({"port": 0}, "serverId.port"),
        ({"port": -1}, "serverId.port"),
        ({"netty_port": 70000}, "serverId.netty_port"),
        ({"netty_port": -2}, "serverId.netty_port"),
        ({"jetty_port": 65536}, "serverId.jetty_port"),
        ({"jetty_port": -7}, "serverId.jetty_port"),
    ],
)
def test_ports_are_1_to_65535_and_netty_jetty_may_say_none(server: dict[str, int], field: str) -> None:
    problems = heartbeat_problems(beat(sid="opaque", server=server))
    assert fields_of(problems) == [field], problems


@pytest.mark.parametrize(
    "name", ["usedMemory", "preAllocatedMemory", "availableMemory", "eventNumInFlush", "startTimeMs"]
)
def test_sizes_and_counts_are_not_negative(name: str) -> None:
    assert heartbeat_problems(beat(**{name: -1})) == [f"{name}: -1 is negative"]


def test_disk_figures_are_not_negative_and_entries_are_bounded() -> None:
    bad = beat(storageInfo={"/d": pb.StorageInfo(mountPoint="/d", capacity=-1, usedBytes=-5)})
    assert fields_of(heartbeat_problems(bad)) == ["storageInfo['/d'].capacity", "storageInfo['/d'].usedBytes"]
    many = beat(storageInfo={f"/d{i}": pb.StorageInfo(mountPoint=f"/d{i}") for i in range(257)})
    assert heartbeat_problems(many) == ["storageInfo: 257 entries, more than 256"]
    control = beat(storageInfo={"/d\n": pb.StorageInfo(mountPoint="/d")})
    assert fields_of(heartbeat_problems(control)) == ["storageInfo key"]


def test_tags_are_bounded_and_printable() -> None:
    assert heartbeat_problems(beat(tags=[f"t{i}" for i in range(65)])) == ["tags: 65 tags, more than 64"]
    assert heartbeat_problems(beat(tags=[f"t{i}" for i in range(64)])) == []
    assert heartbeat_problems(beat(tags=["ss_v5", "x" * 257])) == ["tags[1]: 257 characters, more than 256"]
    assert fields_of(heartbeat_problems(beat(tags=["ss_v5", "GRPC\n2024 fake log line"]))) == ["tags[1]"]
    assert heartbeat_problems(beat(tags=[""])) == ["tags[0]: empty"]


def test_the_id_is_bounded_and_cannot_name_another_address() -> None:
    assert id_problem("x" * 257, "10.0.0.1", 1) == "serverId.id: 257 characters, more than 256"
    assert "characters outside" in (id_problem("a b", "10.0.0.1", 1) or "")
    assert "characters outside" in (id_problem("a/../b", "10.0.0.1", 1) or "")
    assert "names another address" in (id_problem("10.0.0.2-19999", "10.0.0.1", 19999) or "")
    assert "names another address" in (id_problem("10.0.0.1-19998", "10.0.0.1", 19999) or "")
    assert id_problem("10.0.0.1-19999-17000", "10.0.0.1", 19999) is None
    assert id_problem("10.0.0.1-19999-17000", "10.0.0.1", 19999, 17000) is None
    assert id_problem("10.0.0.1-19999-17000", "10.0.0.1", 19999, 0) is None  # netty off: not checked
    assert "another netty port" in (id_problem("10.0.0.1-19999-17001", "10.0.0.1", 19999, 17000) or "")
    assert id_problem("fd00:0::5-19999", "fd00::5", 19999) is None  # same address, other spelling
    assert id_problem("rack1-19999", "10.0.0.1", 19999) is None  # not an IP: an opaque id
    long_id = heartbeat_problems(beat(ip="bad", sid="y" * 300))
    assert fields_of(long_id) == ["serverId.ip", "serverId.id"]


def test_other_fields_are_bounded() -> None:
    assert heartbeat_problems(beat(version="v" * 257)) == ["version: 257 characters, more than 256"]
    assert fields_of(heartbeat_problems(beat(gitCommitId="\x1b[31m"))) == ["gitCommitId"]
    apps = [pb.ApplicationInfo(appId="a" * 256)]
    assert heartbeat_problems(beat(applicationInfo=apps)) == [
        "applicationInfo[0].appId: is 256 characters long, at most 255 are allowed"
    ]
    apps = [pb.ApplicationInfo(appId="app_1"), pb.ApplicationInfo(appId="../x")]
    assert fields_of(heartbeat_problems(beat(applicationInfo=apps))) == ["applicationInfo[1].appId"]
    apps = [pb.ApplicationInfo(appId=f"app_{i}") for i in range(10_001)]
    assert heartbeat_problems(beat(applicationInfo=apps)) == ["applicationInfo: 10001 entries, more than 10000"]


def test_the_message_is_one_bounded_line_that_quotes_what_the_peer_sent() -> None:
    req = beat(ip="127.0.0.1; rm -rf /\n" + "A" * 500, port=70000, usedMemory=-1, tags=["x" * 300] * 2,
               version="\n", gitCommitId="\n", sid="z")
    with pytest.raises(InvalidHeartbeat) as err:
        check_heartbeat(req)
    message = str(err.value)
    assert "\n" not in message and len(message) < 600
    assert message.startswith("invalid heartbeat: serverId.ip: '127.0.0.1; rm -rf /\\n")
    assert "serverId.port: 70000 is not a port (1-65535)" in message and message.endswith("and 2 more")
    assert len(err.value.problems) == 7
    assert reject_message(["a: b"]) == "invalid heartbeat: a: b"


def test_decode_normalizes_what_validation_accepted() -> None:
    hb = decode_heartbeat(beat(ip="fd00:0::5", sid="", server={"netty_port": -1, "jetty_port": -1}))
    assert (hb.id, hb.ip, hb.netty_port, hb.http_port) == ("fd00::5-19999", "fd00::5", 0, 0)
    unknown_media = beat(storageInfo={"/d": pb.StorageInfo(mountPoint="/d", storageMedia=42, status=42)})
    assert heartbeat_problems(unknown_media) == []
    [disk] = decode_heartbeat(unknown_media).disks
    assert (disk.media, disk.status) == ("STORAGE_TYPE_UNKNOWN", "STORAGE_STATUS_UNKNOWN")


# ----------------------------------------------------------------------------- source of the heartbeat


def test_peer_host_parses_grpc_peer_strings() -> None:
    assert peer_host("ipv4:10.0.0.5:41234") == "10.0.0.5"
    assert peer_host("ipv6:[::1]:5000") == "::1"
    assert peer_host("ipv6:[::ffff:10.0.0.5]:5000") == "10.0.0.5"
    assert peer_host("unix:/tmp/sock") is None
    assert peer_host("") is None and peer_host(None) is None


def test_allowed_networks_check_the_peer_and_the_advertised_address() -> None:
    nets = parse_networks(["10.0.0.0/8", "fd00::/8"])
    assert source_problem("10.1.2.3", "10.9.9.9", nets) is None
    assert source_problem("::ffff:10.1.2.3", "10.9.9.9", nets) is None
    assert source_problem("fd00::1", "fd00::2", nets) is None
    assert "source 192.168.1.1 is not in" in (source_problem("192.168.1.1", "10.0.0.1", nets) or "")
    assert "advertised address 8.8.8.8" in (source_problem("10.0.0.1", "8.8.8.8", nets) or "")
    assert "source unknown" in (source_problem(None, "10.0.0.1", nets) or "")
    assert source_problem(None, "8.8.8.8", ()) is None  # no list: any source


def test_repeat_filter_logs_the_1st_10th_100th_and_stays_bounded() -> None:
    f = RepeatFilter(size=3)
    assert [n for n in (f.hit("a") for _ in range(100)) if n] == [1, 10, 100]
    for key in ("b", "c", "d"):
        f.hit(key)
    assert f.hit("a") == 1  # forgotten: the oldest key went first
    assert len(f._seen) == 3


# ----------------------------------------------------------------------------- registry admission


def hb(i: int, *, ip: str | None = None, port: int = 19999, sid: str | None = None) -> ServerHeartbeat:
    ip = ip or f"10.0.0.{i}"
    return ServerHeartbeat(id=sid or f"{ip}-{port}", ip=ip, grpc_port=port, tags=frozenset({"ss_v5", "GRPC"}))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def test_registry_cap_refuses_new_ids_but_keeps_refreshing_known_ones(clock: ManualClock) -> None:
    reg = ClusterRegistry(clock=clock, heartbeat_timeout_s=30, capacity=2)
    assert reg.heartbeat(hb(1)) and reg.heartbeat(hb(2))
    full = r"registry is full \(2 servers, \[server\] max_servers\)"
    with pytest.raises(HeartbeatRefused, match=full) as err:
        reg.heartbeat(hb(3))
    assert err.value.kind == "registry_full"
    assert reg.heartbeat(hb(1)) is False  # a registered server is not affected
    clock.advance(31)
    reg.expire()
    assert reg.heartbeat(hb(3)) is True  # room again once silent servers are gone
    assert reg.stats().refused == {"registry_full": 1}


def test_ids_per_source_host_are_capped(clock: ManualClock) -> None:
    reg = ClusterRegistry(clock=clock, heartbeat_timeout_s=30, max_per_host=2)
    reg.heartbeat(hb(1), peer_host="192.0.2.9")
    reg.heartbeat(hb(2), peer_host="192.0.2.9")
    with pytest.raises(HeartbeatRefused, match=r"already registered from 192\.0\.2\.9") as err:
        reg.heartbeat(hb(3), peer_host="192.0.2.9")
    assert err.value.kind == "host_limit"
    assert reg.heartbeat(hb(3), peer_host="192.0.2.10") is True  # another host is fine
    assert reg.heartbeat(hb(1), peer_host="192.0.2.9") is False  # refreshing is fine
    reg.heartbeat(hb(2), peer_host="192.0.2.11")  # server 2 now comes from elsewhere: a slot frees up
    assert reg.heartbeat(hb(4), peer_host="192.0.2.9") is True


def test_a_live_id_cannot_be_taken_from_another_address(clock: ManualClock) -> None:
    reg = ClusterRegistry(clock=clock, heartbeat_timeout_s=30)
    reg.heartbeat(hb(1, sid="shuffle-a"), peer_host="10.0.0.1")
    for _ in range(3):
        with pytest.raises(HeartbeatRefused, match="shuffle-a is registered from 10.0.0.1:19999") as err:
            reg.heartbeat(hb(6, sid="shuffle-a"), peer_host="10.0.0.6")
        assert err.value.kind == "id_conflict"
        reg.heartbeat(hb(1, sid="shuffle-a"), peer_host="10.0.0.1")
    assert reg.id_conflicts_total == 1  # logged and counted once per change, not per heartbeat
    with pytest.raises(HeartbeatRefused):
        reg.heartbeat(hb(7, sid="shuffle-a"))
    assert reg.id_conflicts_total == 2 and reg.refused["id_conflict"] == 4
    assert reg.get("shuffle-a").heartbeat.ip == "10.0.0.1"  # type: ignore[union-attr]
    # once the holder is silent for the timeout, the id moves
    clock.advance(31)
    assert reg.heartbeat(hb(6, sid="shuffle-a"), peer_host="10.0.0.6") is True
    assert reg.get("shuffle-a").heartbeat.ip == "10.0.0.6"  # type: ignore[union-attr]
